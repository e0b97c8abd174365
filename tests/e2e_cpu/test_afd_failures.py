"""AFD deployments fail loudly and promptly: mismatched peers, a peer that stops.

Real vLLM servers over ``P2pGlooAFDConnector``; every wait is bounded by a short
``afd_process_group_timeout_s`` so that a hang would fail the test, not stall CI.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from afd_core.launch import DeploymentSpec, LocalDeployment, ServerSpec, VllmServer, free_ports
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import complete

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-moe"
PEER_TIMEOUT_S = 30
#: Server start (imports, engine init) plus the rendezvous timeout, with room to spare.
EXIT_DEADLINE_S = 150.0


def afd_server(
    role: str,
    model: Path,
    work_dir: Path,
    cache_root: Path,
    port: int,
    connector_port: int,
    num_attention_ranks: int = 1,
) -> VllmServer:
    """One server of a hand-made AFD deployment (so the roles can disagree)."""
    config = {
        "afd": {
            "role": role,
            "connector": "P2pGlooAFDConnector",
            "host": "127.0.0.1",
            "port": connector_port,
            "num_attention_ranks": num_attention_ranks,
            "num_ffn_ranks": 1,
            "afd_process_group_timeout_s": PEER_TIMEOUT_S,
        }
    }
    spec = ServerSpec(
        name=f"{role}-0",
        model=model,
        port=port,
        additional_config=config,
        dev_mode=role == "ffn",
    )
    return VllmServer(spec, work_dir, cache_root)


def wait_exit(server: VllmServer, deadline_s: float) -> float:
    """Seconds until ``server``'s API process exits; fails the test past the deadline."""
    end = time.monotonic() + deadline_s
    while server.running:
        if time.monotonic() > end:
            pytest.fail(f"{server.spec.name} still running after {deadline_s:.0f} s")
        time.sleep(0.5)
    return server.seconds_since_start()


def test_mismatched_attention_rank_counts_fail_both_roles_at_start(
    tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    model = tiny_models / MODEL
    connector_port, ffn_port, attention_port = free_ports(3)
    ffn = afd_server(
        "ffn", model, tmp_path, vllm_cache_root, ffn_port, connector_port, num_attention_ranks=2
    )
    attention = afd_server(
        "attention",
        model,
        tmp_path,
        vllm_cache_root,
        attention_port,
        connector_port,
        num_attention_ranks=1,
    )
    try:
        ffn.start()
        attention.start()
        for server in (ffn, attention):
            wait_exit(server, EXIT_DEADLINE_S)
        for server in (ffn, attention):
            log = server.log_path.read_text(errors="replace")
            assert "num_attention_ranks" in log, server.log_tail()
            assert "AFDProtocolError" in log or "AFD rendezvous" in log, server.log_tail()
    finally:
        ffn.stop()
        attention.stop()


@pytest.mark.parametrize("stopped_role", ["ffn", "attention"])
def test_stopping_one_role_ends_the_other_roles_waits_with_a_clear_error(
    stopped_role: str, tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    spec = DeploymentSpec(
        model=tiny_models / MODEL,
        extra_args=(),
    )
    deployment = LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root)
    with deployment:
        # The deployment serves before anything is stopped.
        assert complete(deployment.endpoint, PROMPTS[:1], 4)[0].token_ids
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        stopped, survivor = (ffn, attention) if stopped_role == "ffn" else (attention, ffn)
        errors: list[BaseException] = []
        if stopped_role == "ffn":
            # A long request keeps the attention rank waiting on FFN while FFN stops.
            request = threading.Thread(
                target=_request_expecting_failure, args=(attention.url, errors)
            )
            request.start()
            time.sleep(2.0)
        stopped.stop()
        # The survivor notices the lost peer and exits with the AFD error in its log.
        took = wait_exit(survivor, EXIT_DEADLINE_S)
        log = survivor.log_path.read_text(errors="replace")
        assert "AFDPeerError" in log or "closed the connection" in log, survivor.log_tail()
        if stopped_role == "ffn":
            request.join(timeout=60)
            assert not request.is_alive(), "the in-flight request still hangs"
            assert errors, "the request in flight while FFN stopped did not fail"
        print(f"{survivor.spec.name} exited {took:.1f} s after start")


def _request_expecting_failure(url: str, errors: list[BaseException]) -> None:
    try:
        complete(url, PROMPTS, 200, timeout_s=90.0)
    except BaseException as exc:
        errors.append(exc)
