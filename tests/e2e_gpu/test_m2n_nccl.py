"""ExpertRoutedAFDConnector over NCCL: one process per GPU, FFN ranks first.

Every FFN rank applies a known function per expert (global expert ``e`` multiplies by
``e + 1 + layer``) to the rows routed to it, on its GPU; each attention rank checks every
combined result exactly on its GPU (small integers, exact in float32). Layer 2 routes
every token to experts 0..3 (FFN rank 0's block with two FFN ranks), so the other rank
gets no row of it. Skips without one GPU per rank (NCCL cannot pair two processes on one
GPU): 1A2F needs three, 2A2F four.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e_gpu.gpu_settings import cuda_device_count
from tests.e2e_gpu.spawned import Ranks, port, ranks

__all__ = ["port", "ranks"]  # fixtures

E, K, H = 8, 2, 256
LAYERS = (1, 2, 3)  # layer 0 is dense: it does not exchange
STEP_TOKENS = (1, 8, 37, 256)


def wire() -> Any:
    from afd_core.connector import WireSpec

    return WireSpec(
        hidden_size=H,
        dtype="float32",
        num_exchange_layers=len(LAYERS),
        router_logits_width=E,
        num_experts=E,
        top_k=K,
        exchange_layer_ids=LAYERS,
        dense_layers=(0,),
    )


def connect(role: str, rank: int, port: int, a: int, f: int) -> Any:
    import torch

    from afd_connectors_gpu.expert_routed import ExpertRoutedAFDConnector
    from afd_core.config import AFDConfig

    device = rank if role == "ffn" else f + rank
    torch.cuda.set_device(device)
    config = AFDConfig(
        role=role,  # type: ignore[arg-type]
        connector="ExpertRoutedAFDConnector",
        port=port,
        num_attention_ranks=a,
        num_ffn_ranks=f,
        afd_process_group_timeout_s=60,
        compute_gate_on_attention=True,
        connector_extra_config={"transport": "nccl"},
        expert_placement="balanced",
    )
    conn = ExpertRoutedAFDConnector(config, rank, wire())
    conn.initialize()
    return conn


def expert_function(x: Any, ids: Any, weights: Any, layer: int) -> Any:
    return sum(
        weights[:, j : j + 1] * x * (ids[:, j : j + 1].float() + 1 + layer) for j in range(K)
    )


def serve(port: int, a: int, f: int, rank: int) -> dict[str, Any]:
    """FFN rank: serve until every attention rank's steps are done; report its rows."""
    conn = connect("ffn", rank, port, a, f)
    first, served, devices = conn.ffn.block.start, 0, set()
    try:
        while served < a * len(STEP_TOKENS):
            step = conn.ffn.next_step()
            for layer in LAYERS:
                batch = conn.ffn.recv(step, layer, 0)
                devices.add(str(batch.hidden.device))
                routing = batch.routing
                out = expert_function(
                    batch.hidden, routing.topk_ids + first, routing.topk_weights, layer
                )
                conn.ffn.send(batch, out)
            served += len(step.attention_ranks)
        return {"stats": conn.ffn.stats(), "devices": sorted(devices)}
    finally:
        conn.close()


def attend(port: int, a: int, f: int, rank: int) -> dict[str, Any]:
    """Attention rank: every step and layer, check the combined result exactly."""
    import torch

    from afd_core.connector import ExpertRouting
    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    conn = connect("attention", rank, port, a, f)
    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device).manual_seed(100 + rank)
    mismatches, checked = [], 0
    try:
        for step_id, n in enumerate(STEP_TOKENS):
            conn.attention.begin_step(ControlPayload(step_id, rank, (AFDDPMetadata(rank, (n,)),)))
            for layer in LAYERS:
                x = torch.randint(-5, 5, (n, H), generator=gen, device=device).float()
                span = 4 if layer == 2 else E
                scores = torch.rand(n, span, generator=gen, device=device)
                ids = scores.topk(K, dim=1).indices.int()
                weights = torch.randint(1, 4, (n, K), generator=gen, device=device).float()
                conn.attention.send(layer, 0, x, routing=ExpertRouting(ids, weights))
                out = conn.attention.recv(layer, 0)
                if not torch.equal(out, expert_function(x, ids, weights, layer)):
                    mismatches.append((step_id, layer))
                checked += 1
        return {"mismatches": mismatches, "checked": checked, "stats": conn.attention.stats()}
    finally:
        conn.close()


@pytest.mark.parametrize(("a", "f"), [(1, 2), (2, 2)], ids=["1A2F", "2A2F"])
def test_routed_exchanges_over_nccl_are_exact_and_each_rank_gets_only_its_rows(
    ranks: Ranks, port: int, a: int, f: int
) -> None:
    if cuda_device_count() < a + f:
        pytest.skip(
            f"needs {a + f} CUDA devices (one per rank: NCCL cannot pair two processes on "
            f"one GPU), {cuda_device_count()} visible"
        )
    for rank in range(f):
        ranks.start(f"ffn{rank}", serve, port, a, f, rank)
    for rank in range(a):
        ranks.start(f"attn{rank}", attend, port, a, f, rank)
    results = ranks.join()
    for rank in range(a):
        attention = results[f"attn{rank}"]
        assert attention["mismatches"] == []
        assert attention["checked"] == len(STEP_TOKENS) * len(LAYERS)
    for rank in range(f):
        ffn = results[f"ffn{rank}"]
        assert ffn["devices"] == [f"cuda:{rank}"]
        received = ffn["stats"]["received_rows"]
        sent = sum(
            results[f"attn{r}"]["stats"]["dispatched_rows"][rank].get(layer, 0)
            for r in range(a)
            for layer in (2,)
        )
        assert received[2] == sent
        if rank == 1:  # layer 2 routes every token into FFN rank 0's block
            assert received[2] == 0
    print(f"RESULT m2n over nccl {a}A{f}F: exact")
