"""Stopping either role of an AFD deployment on two GPUs ends the other's waits, bounded.

AFD 1A1F over ``P2pNcclAFDConnector`` (the roles on the GPUs of
``gpu_settings.role_gpus``), eager and with ``FULL_DECODE_ONLY`` graphs,
``afd_process_group_timeout_s`` short. With graphs the attention rank does not wait for
its replays on the host: a replay whose FFN peer is gone spins on the device until the
connector's replay watch aborts the NCCL group at the timeout; the next step then raises
AFDPeerError and the attention server exits. Skips unless two CUDA devices are visible.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from afd_core.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import complete
from tests.e2e_cpu.test_afd_failures import _request_expecting_failure, wait_exit
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
        errors: list[BaseException] = []
        request = None
        if stopped_role == "ffn":
            # A long request keeps the attention rank decoding while FFN stops.
            request = threading.Thread(
                target=_request_expecting_failure, args=(attention.url, errors)
            )
            request.start()
        stopped.stop()
        took = wait_exit(survivor, EXIT_DEADLINE_S)
        log = survivor.log_path.read_text(errors="replace")
        assert "AFDPeerError" in log or "closed the connection" in log, survivor.log_tail()
        if request is not None:
            request.join(timeout=60)
            assert not request.is_alive(), "the in-flight request still hangs"
            assert errors, "the request in flight while FFN stopped did not fail"
        print(f"RESULT {stopped_role} stopped, graphs={graphs}: {survivor.spec.name} exited "
              f"{took:.1f} s after start")  # fmt: skip
