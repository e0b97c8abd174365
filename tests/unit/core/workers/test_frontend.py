"""The frontend watch: a recorded failure is a non-zero exit, descendants end with the frontend.

Real processes (``python -c``), no vLLM: the frontend, its child and grandchild are what
vLLM's API server, engine core and worker are to each other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from afd_core.workers.frontend import (
    ENGINE_GONE_GRACE_S,
    FAILURE_EXIT_STATUS,
    FAILURE_RECORD_ENV,
    FRONTEND_PID_ENV,
    is_api_server,
    record_failure,
    recorded_failure,
    watch_frontend,
)

#: Generous bound for a process to notice its frontend's end and exit (pidfd: at once;
#: the SIGTERM it sends itself ends a plain Python process at once).
EXIT_BOUND_S = 10.0


def run_python(code: str, tmp_path: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"TMPDIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, **kwargs
    )


def test_a_frontend_exits_non_zero_when_a_descendant_recorded_a_failure(tmp_path: Path) -> None:
    code = """
import subprocess, sys
from afd_core.workers.frontend import become_frontend
become_frontend()
subprocess.run([sys.executable, "-c", '''
from afd_core.workers.frontend import record_failure
record_failure("FFN", RuntimeError("attention rank 0 did not arrive"))
record_failure("FFN", RuntimeError("a later failure"))
'''], check=True)
"""
    result = run_python(code, tmp_path)
    assert result.returncode == FAILURE_EXIT_STATUS, result.stderr
    assert "attention rank 0 did not arrive" in result.stderr
    assert "a later failure" not in result.stderr
    assert not list(tmp_path.glob("afd-failure-*")), "the record outlived its frontend"


def test_a_frontend_without_a_recorded_failure_keeps_its_exit_status(tmp_path: Path) -> None:
    result = run_python(
        "from afd_core.workers.frontend import become_frontend; become_frontend()", tmp_path
    )
    assert result.returncode == 0, result.stderr
    result = run_python(
        "import sys; from afd_core.workers.frontend import become_frontend; "
        "become_frontend(); sys.exit(3)",
        tmp_path,
    )
    assert result.returncode == 3


def test_record_failure_outside_an_afd_server_does_nothing(tmp_path: Path) -> None:
    record_failure("attention", RuntimeError("lost"), environ={})
    assert not list(tmp_path.iterdir())
    environ = {FAILURE_RECORD_ENV: str(tmp_path / "record")}
    record_failure("attention", RuntimeError("lost"), environ=environ)
    assert recorded_failure(tmp_path / "record") == "AFD attention: RuntimeError: lost"


WORKER = """
import time
from afd_core.workers.frontend import watch_frontend
assert watch_frontend()
print("worker", flush=True)
time.sleep(120)
"""
ENGINE = f"""
import subprocess, sys, time
from afd_core.workers.frontend import watch_frontend
assert watch_frontend()
worker = subprocess.Popen([sys.executable, "-c", {WORKER!r}], stdout=sys.stdout)
print("pids", worker.pid, flush=True)
time.sleep(120)
"""
FRONTEND = f"""
import os, subprocess, sys, time
from afd_core.workers.frontend import become_frontend
become_frontend()
engine = subprocess.Popen([sys.executable, "-c", {ENGINE!r}], stdout=sys.stdout)
print("engine", engine.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_the_engine_and_worker_end_when_their_frontend_is_killed(how: str, tmp_path: Path) -> None:
    # frontend -> engine -> worker, like vLLM's API server, engine core and worker.
    frontend = subprocess.Popen(
        [sys.executable, "-c", FRONTEND],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path)},
    )
    try:
        assert frontend.stdout is not None
        lines = [frontend.stdout.readline() for _ in range(3)]
        words = {line.split()[0]: line.split()[1:] for line in lines if line.strip()}
        assert set(words) == {"engine", "pids", "worker"}, lines
        pids = [int(words["engine"][0]), int(words["pids"][0])]
        os.kill(frontend.pid, getattr(signal, how))
        frontend.wait(timeout=10)
        end = time.monotonic() + EXIT_BOUND_S
        while alive := [pid for pid in pids if _exists(pid)]:
            assert time.monotonic() < end, f"{alive} outlived their frontend"
            time.sleep(0.1)
    finally:
        frontend.kill()
        frontend.wait()


def test_the_watch_ignores_a_pid_that_is_not_an_ancestor() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not watch_frontend(environ={FRONTEND_PID_ENV: str(other.pid)})
        assert not watch_frontend(environ={FRONTEND_PID_ENV: str(os.getpid())})
        assert not watch_frontend(environ={})
        assert not watch_frontend(environ={FRONTEND_PID_ENV: "not a pid"})
    finally:
        other.kill()
        other.wait()


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as ended; its parent is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


API_SERVER = """
import subprocess, sys, time
sys.argv[0] = "/site-packages/vllm/entrypoints/openai/api_server.py"
from afd_core.workers.frontend import become_frontend
become_frontend()
engine = subprocess.Popen([sys.executable, "-c", '''
import time
open("/proc/self/comm", "w").write("VLLM::EngineCore")
time.sleep(1.5)
'''])
engine.wait()
time.sleep(60)  # a connection that never closes keeps vLLM's API server up
"""


def test_an_api_server_still_running_after_its_engine_ended_is_ended(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_python(API_SERVER, tmp_path)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "ended" in result.stderr and "still runs" in result.stderr, result.stderr
    assert took < 1.5 + ENGINE_GONE_GRACE_S + 10.0, took


def test_an_offline_program_is_never_ended_for_its_engine() -> None:
    assert is_api_server(["/venv/lib/site-packages/vllm/entrypoints/openai/api_server.py"])
    assert is_api_server(["/venv/bin/vllm"])
    assert not is_api_server(["my_batch_job.py"])
    assert not is_api_server(["-c"])
