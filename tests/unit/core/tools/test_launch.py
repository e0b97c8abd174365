"""The local launcher without vLLM: server command lines and environments, the AFD
settings of each server of a deployment, and stopping a whole process tree.

The process tests start small Python stand-ins instead of vLLM (Linux ``/proc`` needed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from afd_core.errors import AFDConfigError
from afd_core.tools.launch import (
    DeploymentSpec,
    ServerError,
    ServerSpec,
    VllmServer,
    deployment,
    free_ports,
)
from afd_core.tools.launch.processes import kill_session, session_processes, started_sessions
from tests.unit.core.fake_connectors import CONNECTORS

needs_proc = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = types.ModuleType("afd_core.plugins.registry")
    registry.get_registry = lambda: SimpleNamespace(connectors=CONNECTORS)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "afd_core.plugins.registry", registry)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_server_command_runs_the_openai_api_server_with_the_cpu_settings():
    spec = ServerSpec(name="s", model=Path("/models/tiny-qwen3-moe"), port=8123)
    cmd = spec.command(python="/py")
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--model") == "/models/tiny-qwen3-moe"
    assert _flag(cmd, "--served-model-name") == "tiny-qwen3-moe"
    assert (_flag(cmd, "--host"), _flag(cmd, "--port")) == ("127.0.0.1", "8123")
    assert _flag(cmd, "--kv-cache-memory-bytes") == str(64 * 1024 * 1024)
    assert (_flag(cmd, "--dtype"), _flag(cmd, "--seed")) == ("bfloat16", "0")
    assert "--enforce-eager" in cmd
    assert "--additional-config" not in cmd


def test_server_command_carries_the_additional_config_as_json_and_extra_args_last():
    spec = ServerSpec(
        name="s",
        model=Path("/m"),
        port=1,
        enforce_eager=False,
        additional_config={"afd": {"role": "ffn", "port": 29600}},
        extra_args=("--max-logprobs", "9"),
    )
    cmd = spec.command()
    assert json.loads(_flag(cmd, "--additional-config")) == {"afd": {"role": "ffn", "port": 29600}}
    assert "--enforce-eager" not in cmd
    assert cmd[-2:] == ["--max-logprobs", "9"]


def test_server_environment_is_offline_private_tmp_shared_cache_and_keeps_user_binding():
    spec = ServerSpec(name="s", model=Path("/m"), port=1)
    base = {"PATH": "/bin", "VLLM_CPU_OMP_THREADS_BIND": "0", "TMPDIR": "/elsewhere"}
    env = spec.environment(base, Path("/t/s"), Path("/cache"))
    assert env["PATH"] == "/bin"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert (env["TMPDIR"], env["VLLM_CACHE_ROOT"]) == ("/t/s", "/cache")
    assert env["HF_HUB_OFFLINE"] == env["VLLM_NO_USAGE_STATS"] == env["DO_NOT_TRACK"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in env
    assert spec.environment({}, Path("/t"), Path("/c"))["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_dev_mode_server_serves_collective_rpc():
    spec = ServerSpec(name="s", model=Path("/m"), port=1, dev_mode=True)
    assert spec.environment({}, Path("/t"), Path("/c"))["VLLM_SERVER_DEV_MODE"] == "1"


def test_two_attention_one_ffn_gives_each_server_its_role_rank_and_the_shared_topology():
    spec = DeploymentSpec(
        model=Path("/m"), num_attention_ranks=2, connector="FakeP2P", compute_gate_on_attention=True
    )
    servers = spec.server_specs(
        connector_port=29700, attention_ports=[9000, 9001], ffn_ports=[9100]
    )
    assert [s.name for s in servers] == ["ffn-0", "attention-0", "attention-1"]
    assert [s.port for s in servers] == [9100, 9000, 9001]
    assert [s.dev_mode for s in servers] == [True, True, True]  # every role reports afd_stats
    afd = [s.additional_config["afd"] for s in servers]
    assert [(a["role"], a["role_rank"]) for a in afd] == [
        ("ffn", 0),
        ("attention", 0),
        ("attention", 1),
    ]
    for settings in afd:
        assert settings["port"] == 29700
        assert (settings["num_attention_ranks"], settings["num_ffn_ranks"]) == (2, 1)
        assert settings["compute_gate_on_attention"] is True


def test_extra_args_and_env_reach_every_server_of_the_deployment():
    spec = DeploymentSpec(
        model=Path("/m"),
        connector="FakeP2P",
        extra_args=("--gpu-memory-utilization", "0.2"),
        extra_env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
    )
    servers = spec.server_specs(29700, attention_ports=[9000], ffn_ports=[9100])
    for server in servers:
        assert server.command()[-2:] == ["--gpu-memory-utilization", "0.2"]
        env = server.environment({"VLLM_USE_V2_MODEL_RUNNER": "1"}, Path("/t"), Path("/c"))
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_role_cpus_bind_each_role_to_its_cpus_and_its_openmp_threads_there():
    spec = DeploymentSpec(
        model=Path("/m"), connector="FakeP2P", role_cpus={"attention": (0,), "ffn": (1, 2)}
    )
    servers = {s.name: s for s in spec.server_specs(29700, [9000], [9100])}
    assert (servers["attention-0"].cpus, servers["ffn-0"].cpus) == ((0,), (1, 2))
    base = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env = servers["ffn-0"].environment(base, Path("/t"), Path("/c"))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1,2"  # the spec's CPUs win over the base
    unpinned = DeploymentSpec(model=Path("/m"), connector="FakeP2P").server_specs(1, [2], [3])
    assert all(server.cpus == () for server in unpinned)


def test_rank_gpus_put_each_server_of_a_role_on_its_own_gpu_over_the_role_env():
    spec = DeploymentSpec(
        model=Path("/m"),
        connector="FakeP2P",
        num_attention_ranks=2,
        role_env={"attention": {"CUDA_VISIBLE_DEVICES": "7"}, "ffn": {"X": "1"}},
        rank_gpus={"attention": ("0", "1"), "ffn": ("2",)},
    )
    servers = spec.server_specs(29700, [9000, 9001], [9100])
    env = {s.name: s.environment({}, Path("/t"), Path("/c")) for s in servers}
    assert [env[n]["CUDA_VISIBLE_DEVICES"] for n in ("attention-0", "attention-1", "ffn-0")] == [
        "0",
        "1",
        "2",
    ]
    assert env["ffn-0"]["X"] == "1"
    short = DeploymentSpec(model=Path("/m"), connector="FakeP2P", rank_gpus={"ffn": ("0", "1")})
    with pytest.raises(ValueError, match=r"rank_gpus\['ffn'\] names 2 GPU\(s\) for 1 ffn"):
        short.server_specs(29700, [9000], [9100])


def test_a_server_spec_refuses_repeated_or_negative_cpus():
    for cpus in ((0, 0), (-1,)):
        with pytest.raises(ValueError, match="distinct CPU numbers"):
            ServerSpec(name="s", model=Path("/m"), port=1, cpus=cpus)


def test_the_afd_timeout_reaches_both_roles_only_when_set():
    def timeouts(spec: DeploymentSpec) -> list[object]:
        servers = spec.server_specs(29700, attention_ports=[9000], ffn_ports=[9100])
        return [s.additional_config["afd"].get("afd_process_group_timeout_s") for s in servers]

    assert timeouts(DeploymentSpec(model=Path("/m"), connector="FakeP2P")) == [None, None]
    spec = DeploymentSpec(model=Path("/m"), connector="FakeP2P", afd_process_group_timeout_s=20)
    assert timeouts(spec) == [20, 20]


def test_every_server_of_a_deployment_gets_its_secret_which_no_repr_shows():
    from afd_core.runtime.store_gate import SECRET_ENV

    spec = DeploymentSpec(model=Path("/m"), num_attention_ranks=2, connector="FakeP2P")
    servers = spec.server_specs(29700, attention_ports=[9000, 9001], ffn_ports=[9100])
    secrets = {s.environment({}, Path("/t"), Path("/c"))[SECRET_ENV] for s in servers}
    assert secrets == {spec.rendezvous_secret} and len(spec.rendezvous_secret) >= 32
    assert DeploymentSpec(model=Path("/m")).rendezvous_secret != spec.rendezvous_secret
    for text in (repr(spec), *map(repr, servers)):
        assert spec.rendezvous_secret not in text
    plain = DeploymentSpec(model=Path("/m"), connector="FakeP2P", rendezvous_secret="")
    for server in plain.server_specs(29700, attention_ports=[9000], ffn_ports=[9100]):
        assert SECRET_ENV not in server.environment({}, Path("/t"), Path("/c"))


def test_invalid_deployment_is_rejected_before_any_server_exists():
    spec = DeploymentSpec(
        model=Path("/m"), num_attention_ranks=1, num_ffn_ranks=2, connector="FakeP2P"
    )
    with pytest.raises(AFDConfigError, match="num_attention_ranks"):
        spec.server_specs(29700, attention_ports=[9000], ffn_ports=[9100, 9101])


def test_free_ports_are_distinct():
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports)


def test_free_ports_stay_out_of_the_ephemeral_range(monkeypatch, tmp_path):
    # Outgoing connections take ephemeral ports; a port from there can be gone by the
    # time a slow server binds it.
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768\t60999\n")
    monkeypatch.setattr(deployment, "_EPHEMERAL_RANGE_FILE", range_file)
    assert all(20000 <= p < 32768 for p in free_ports(5))
    range_file.write_text("1024\t65535\n")  # no room below: the OS picks
    assert len(set(free_ports(3))) == 3


# A stand-in server: a child that ignores SIGTERM and keeps running, like a stuck worker.
_STUBBORN_TREE = (
    "import signal, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
    "print('child', child.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def _fake_server(monkeypatch, tmp_path: Path, script: str) -> VllmServer:
    monkeypatch.setattr(
        ServerSpec, "command", lambda self, python=sys.executable: [python, "-c", script]
    )
    return VllmServer(ServerSpec(name="fake", model=tmp_path, port=1), tmp_path / "logs")


@needs_proc
def test_stop_ends_a_child_that_ignores_sigterm_and_removes_the_tmpdir(monkeypatch, tmp_path):
    server = _fake_server(monkeypatch, tmp_path, _STUBBORN_TREE)
    server.start()
    deadline = time.monotonic() + 30
    while len(server.leftover_pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(server.leftover_pids()) == 2
    assert server.pid in started_sessions()
    status = server.stop(grace_s=0.5)
    assert status == -signal.SIGTERM
    assert server.leftover_pids() == []
    assert server.tmp_dir is not None and not server.tmp_dir.exists()


@needs_proc
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_a_pinned_server_and_its_children_run_only_on_its_cpus(monkeypatch, tmp_path):
    cpu = max(os.sched_getaffinity(0))
    child = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)))"
    script = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    monkeypatch.setattr(
        ServerSpec, "command", lambda self, python=sys.executable: [python, "-c", script]
    )
    server = VllmServer(ServerSpec(name="pinned", model=tmp_path, port=1, cpus=(cpu,)), tmp_path)
    server.start()
    deadline = time.monotonic() + 30
    while server.running and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop(grace_s=0.5)
    assert server.log_path.read_text().strip() == f"[{cpu}]"


@needs_proc
def test_a_server_that_exits_is_reported_with_its_log_tail(monkeypatch, tmp_path):
    server = _fake_server(monkeypatch, tmp_path, "print('model too large'); raise SystemExit(3)")
    server.start()
    with pytest.raises(ServerError, match=r"(?s)exited with status 3.*model too large"):
        server.wait_healthy(time.monotonic() + 30)
    server.stop()


@needs_proc
def test_kill_session_ends_every_member_of_the_session():
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN_TREE], start_new_session=True)
    deadline = time.monotonic() + 30
    while len(session_processes(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = kill_session(proc.pid)
    proc.wait(timeout=10)
    assert len(killed) == 2 and proc.pid in killed
    assert session_processes(proc.pid) == []


@needs_proc
def test_a_server_error_quotes_the_first_error_lines_above_a_long_tail(monkeypatch, tmp_path):
    script = (
        "print('ERROR 11-29 [server.py:1] AFD FFN rank 0: address already in use')\n"
        "for i in range(100): print('shutdown noise', i)\n"
        "raise SystemExit(1)"
    )
    server = _fake_server(monkeypatch, tmp_path, script)
    server.start()
    with pytest.raises(ServerError) as failure:
        server.wait_healthy(time.monotonic() + 30)
    server.stop()
    message = str(failure.value)
    assert "first error lines" in message and "address already in use" in message
    assert "shutdown noise 99" in message and "shutdown noise 10\n" not in message
