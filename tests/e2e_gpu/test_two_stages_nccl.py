"""Two stages per step over NCCL: the real connectors, one process per GPU.

Each attention rank runs its steps as the attention runner does with ``num_stages`` 2:
the batch's two stages take turns on the real :class:`StageScheduler`'s threads (send,
turn, receive at every layer), both on the rank's CUDA stream. Each FFN rank serves
layer-major, stage by stage, as afd-ffn's server does. NCCL runs a pair's sends and
receives in posting order on one stream; the P2P and expert-routed attention endpoints
post each reply's receive inside ``send``, so the pair's order matches the FFN rank's
(``tests/unit/roles/test_two_stages_ordered_pairs.py`` checks that order on an in-order
loopback). Every result is checked exactly (small integers in float32), over many
steps of mixed stage sizes. Skips without one GPU per rank (NCCL cannot pair two
processes on one GPU): P2P 1A1F needs two, 2A1F three, expert-routed 1A2F three.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e_gpu.gpu_settings import cuda_device_count
from tests.e2e_gpu.spawned import Ranks, port, ranks

__all__ = ["port", "ranks"]  # fixtures

E, K, H = 8, 2, 256
LAYERS = (0, 1, 2)
#: Tokens of the two stages of each step (every attention rank runs them all).
STEP_STAGES = ((1, 1), (3, 5), (16, 16), (37, 64), (128, 100)) * 40


def _wire(expert: bool) -> Any:
    from afd_core.connector import WireSpec

    if not expert:
        return WireSpec(hidden_size=H, dtype="float32", num_exchange_layers=len(LAYERS))
    return WireSpec(
        hidden_size=H,
        dtype="float32",
        num_exchange_layers=len(LAYERS),
        router_logits_width=E,
        num_experts=E,
        top_k=K,
    )


def _connect(role: str, rank: int, port: int, a: int, f: int, expert: bool) -> Any:
    import torch

    from afd_core.config import AFDConfig

    torch.cuda.set_device(rank if role == "ffn" else f + rank)
    extra = {"transport": "nccl"} if expert else {}
    name = "ExpertRoutedAFDConnector" if expert else "P2pNcclAFDConnector"
    config = AFDConfig(
        role=role,  # type: ignore[arg-type]
        connector=name,
        port=port,
        num_attention_ranks=a,
        num_ffn_ranks=f,
        afd_process_group_timeout_s=60,
        compute_gate_on_attention=expert,
        connector_extra_config=extra,
        expert_placement="balanced" if expert else None,
        num_stages=2,
    )
    if expert:
        from afd_connectors_gpu.expert_routed import ExpertRoutedAFDConnector as cls
    else:
        from afd_connectors_gpu.p2p_nccl import P2pNcclAFDConnector as cls
    conn = cls(config, rank, _wire(expert))
    conn.initialize()
    return conn


def _ffn_function(x: Any, layer: int, routing: Any, first: int) -> Any:
    if routing is None:
        return x * 2 - layer
    ids, weights = routing.topk_ids + first, routing.topk_weights
    return sum(
        weights[:, j : j + 1] * x * (ids[:, j : j + 1].float() + 1 + layer) for j in range(K)
    )


def serve(port: int, a: int, f: int, rank: int, expert: bool) -> dict[str, Any]:
    """FFN rank: layer-major, stage by stage, until every attention rank's steps are done."""
    conn = _connect("ffn", rank, port, a, f, expert)
    first = conn.ffn.block.start if expert else 0
    served = 0
    try:
        while served < a * len(STEP_STAGES):
            step = conn.ffn.next_step()
            for layer in LAYERS:
                for stage in (0, 1):
                    batch = conn.ffn.recv(step, layer, stage)
                    conn.ffn.send(batch, _ffn_function(batch.hidden, layer, batch.routing, first))
            served += len(step.attention_ranks)
        return {"served": served}
    finally:
        conn.close()


def attend(port: int, a: int, f: int, rank: int, expert: bool) -> dict[str, Any]:
    """Attention rank: every step in two stages on the stage scheduler, checked exactly."""
    import torch

    from afd_attention.stage_scheduler import StageScheduler
    from afd_core.connector import ExpertRouting
    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    conn = _connect("attention", rank, port, a, f, expert)
    endpoint = conn.attention
    stream = torch.cuda.current_stream()
    device = stream.device
    scheduler = StageScheduler(timeout_s=60)
    gen = torch.Generator(device=device).manual_seed(100 + rank)
    mismatches: list[tuple[int, int]] = []

    def stage(s: int, x: Any, routes: list[Any]):
        def forward() -> Any:
            with torch.cuda.stream(stream):
                y = x
                for layer in LAYERS:
                    routing = routes[layer]
                    endpoint.send(layer, s, y, routing=routing)
                    scheduler.checkpoint()
                    y = endpoint.recv(layer, s)
                return y

        return forward

    try:
        for step_id, sizes in enumerate(STEP_STAGES):
            inputs, routes = [], []
            for n in sizes:
                inputs.append(torch.randint(-5, 5, (n, H), generator=gen, device=device).float())
                per_layer = []
                for _ in LAYERS:
                    if not expert:
                        per_layer.append(None)
                        continue
                    ids = torch.rand(n, E, generator=gen, device=device).topk(K, dim=1).indices
                    weights = torch.randint(1, 3, (n, K), generator=gen, device=device).float()
                    per_layer.append(ExpertRouting(ids.int(), weights))
                routes.append(per_layer)
            metadata = tuple(AFDDPMetadata(rank, (n,)) for n in sizes)
            endpoint.begin_step(ControlPayload(step_id, rank, metadata))
            outputs = scheduler.run_step([stage(s, inputs[s], routes[s]) for s in (0, 1)])
            for s in (0, 1):
                want = inputs[s]
                for layer in LAYERS:
                    want = _ffn_function(want, layer, routes[s][layer], 0)
                if not torch.equal(outputs[s], want):
                    mismatches.append((step_id, s))
        return {"mismatches": mismatches, "steps": len(STEP_STAGES)}
    finally:
        scheduler.close()
        conn.close()


@pytest.mark.parametrize(
    ("a", "f", "expert"),
    [(1, 1, False), (2, 1, False), (1, 2, True)],
    ids=["p2p-1A1F", "p2p-2A1F", "expert-routed-1A2F"],
)
def test_two_stages_over_nccl_are_exact_over_many_steps(
    ranks: Ranks, port: int, a: int, f: int, expert: bool
) -> None:
    if cuda_device_count() < a + f:
        pytest.skip(
            f"needs {a + f} CUDA devices (one per rank: NCCL cannot pair two processes on "
            f"one GPU), {cuda_device_count()} visible"
        )
    for rank in range(f):
        ranks.start(f"ffn{rank}", serve, port, a, f, rank, expert)
    for rank in range(a):
        ranks.start(f"attn{rank}", attend, port, a, f, rank, expert)
    results = ranks.join(timeout_s=600)
    for rank in range(a):
        assert results[f"attn{rank}"]["mismatches"] == []
    for rank in range(f):
        assert results[f"ffn{rank}"]["served"] == a * len(STEP_STAGES)
    print(f"RESULT two stages over nccl {a}A{f}F expert={expert}: {len(STEP_STAGES)} steps exact")
