"""Stopping a role of an AFD deployment on two GPUs: bounded waits, no hang.

Stopping FFN ends the attention server's waits (AFDPeerError, exit status 1); stopping
the attention server leaves the FFN server running, waiting for a replacement.

AFD 1A1F over ``P2pNcclAFDConnector`` (the roles on the GPUs of
``gpu_settings.role_gpus``), eager and with ``FULL_DECODE_ONLY`` graphs,
``afd_process_group_timeout_s`` short. With graphs the attention rank does not wait for
its replays on the host: a replay whose FFN peer is gone spins on the device until the
connector's replay watch aborts the NCCL group at the timeout; the next step then raises
AFDPeerError and the attention server exits. Skips unless two CUDA devices are visible.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import complete
from tests.e2e_cpu.test_afd_failures import REQUEST_TOKENS, request_outcome, wait_exit
from tests.e2e_gpu.gpu_settings import cuda_device_count, role_env, server_args

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        cuda_device_count() < 2, reason="needs two CUDA devices (one per role, NCCL)"
    ),
]

MODEL = "tiny-qwen3-moe"
PEER_TIMEOUT_S = 30
#: The survivor's bound: the peer timeout, vLLM's shutdown, and room to spare.
EXIT_DEADLINE_S = PEER_TIMEOUT_S + 90.0


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("stopped_role", ["ffn", "attention"])
def test_stopping_one_role_on_cuda_ends_the_other_roles_waits_with_a_clear_error(
    stopped_role: str, graphs: bool, tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    spec = DeploymentSpec(
        model=tiny_models / MODEL,
        connector="P2pNcclAFDConnector",
        enforce_eager=not graphs,
        extra_args=server_args(graphs=graphs),
        role_env=role_env(one_gpu_per_role=True),
        afd_process_group_timeout_s=PEER_TIMEOUT_S,
        start_timeout_s=300.0,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        assert complete(deployment.endpoint, PROMPTS[:1], 4)[0].token_ids
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        stopped, survivor = (ffn, attention) if stopped_role == "ffn" else (attention, ffn)
        outcome: list[object] = []
        request = None
        if stopped_role == "ffn":
            # A request that may still be decoding when FFN stops (or may have finished);
            # either way it must end, in an error or complete.
            request = threading.Thread(target=request_outcome, args=(attention.url, outcome))
            request.start()
            time.sleep(0.5)
        stopped.stop()
        if stopped_role == "attention":
            # The FFN rank keeps its model and waits for a replacement attention rank.
            time.sleep(5.0)
            log = survivor.log_path.read_text(errors="replace")
            assert survivor.running and "waits up to" in log, survivor.log_tail()
            print(f"RESULT attention stopped, graphs={graphs}: the FFN server keeps serving")
            return
        took = wait_exit(survivor, EXIT_DEADLINE_S)
        log = survivor.log_path.read_text(errors="replace")
        assert "AFDPeerError" in log or "closed the connection" in log, survivor.log_tail()
        assert survivor.exit_status == 1, survivor.log_tail()
        assert request is not None
        request.join(timeout=60)
        assert not request.is_alive(), "the in-flight request still hangs"
        (result,) = outcome
        if not isinstance(result, BaseException):  # it finished before FFN left
            assert all(len(c.token_ids) == REQUEST_TOKENS for c in result), result
        print(f"RESULT {stopped_role} stopped, graphs={graphs}: {survivor.spec.name} exited "
              f"{took:.1f} s after start")  # fmt: skip
