"""ExpertRoutedAFDConnector between real processes over real gloo (its CPU transport).

Every FFN rank applies a known function per expert (global expert ``e`` multiplies by
``e + 1 + layer``) to the rows routed to it; the attention ranks check every combined
result exactly (small integers in float32). Layouts with more FFN than attention ranks,
routes that give an FFN rank no row of a layer, a mispaired layer and a killed peer.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch

from afd_connectors_gpu.expert_routed import ExpertRoutedAFDConnector
from afd_core.config import AFDConfig
from afd_core.connector import ExpertRouting, WireSpec
from afd_core.placement import ExpertPlacement
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from tests.integration.peer_errors import reports_peer_gone, skip_the_exchange_rule

E, K, H = 8, 2, 16
LAYERS = (1, 2, 3)  # layer 0 is dense: it does not exchange
WIRE = WireSpec(
    hidden_size=H,
    dtype="float32",
    num_exchange_layers=len(LAYERS),
    router_logits_width=E,
    num_experts=E,
    top_k=K,
    exchange_layer_ids=LAYERS,
    dense_layers=(0,),
)
STEPS = 3


def connect(
    role: str, rank: int, port: int, a: int, f: int, timeout_s: int = 20, idle_limit_s: int = 0
) -> Any:
    """``idle_limit_s`` 0 (these tests' default): an attention rank that leaves fails the
    FFN ranks; above 0 they let its links go and accept a replacement."""
    config = AFDConfig(
        role=role,  # type: ignore[arg-type]
        connector="ExpertRoutedAFDConnector",
        port=port,
        num_attention_ranks=a,
        num_ffn_ranks=f,
        afd_process_group_timeout_s=timeout_s,
        compute_gate_on_attention=True,
        connector_extra_config={"transport": "gloo"},
        expert_placement="balanced",
        ffn_idle_limit_s=idle_limit_s,
    )
    conn = ExpertRoutedAFDConnector(config, rank, WIRE)
    conn.initialize()
    return conn


def expert_function(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, layer: int) -> Any:
    return sum(
        weights[:, j : j + 1] * x * (ids[:, j : j + 1].float() + 1 + layer) for j in range(K)
    )


def routing(rank: int, step: int, layer: int, n: int, narrow: bool) -> tuple[Any, Any, Any]:
    """Inputs of one layer; ``narrow``: every token's experts among 0..3 (FFN rank 0's
    block in 2-rank layouts), so the other ranks get no row of that layer."""
    gen = torch.Generator().manual_seed(1000 * rank + 10 * step + layer)
    x = torch.randint(-5, 5, (n, H), generator=gen).float()
    span = 4 if narrow else E
    ids = torch.stack([torch.randperm(span, generator=gen)[:K] for _ in range(n)]).int()
    weights = torch.randint(1, 4, (n, K), generator=gen).float()
    return x, ids, weights


def run_ffn(port: int, a: int, f: int, rank: int, finished: Any) -> dict[str, Any]:
    """Serve every step of every attention rank; report what this FFN rank received.

    Then waits at ``finished`` (every rank of the world meets there, so no attention rank
    leaves while an FFN rank still serves; a leaving rank fails the others' next step).
    """
    conn = connect("ffn", rank, port, a, f)
    first = conn.ffn.block.start
    served = 0
    try:
        while served < a * STEPS:
            step = conn.ffn.next_step()
            for layer in LAYERS:
                batch = conn.ffn.recv(step, layer, 0)
                routing_ = batch.routing
                out = expert_function(
                    batch.hidden, routing_.topk_ids + first, routing_.topk_weights, layer
                )
                conn.ffn.send(batch, out)
            served += len(step.attention_ranks)
        finished.wait(30)
        return conn.ffn.stats()
    finally:
        conn.close()


def run_attention(port: int, a: int, f: int, rank: int, finished: Any) -> dict[str, Any]:
    """Run :data:`STEPS` steps; check every layer's result exactly."""
    conn = connect("attention", rank, port, a, f)
    try:
        for step in range(STEPS):
            n = 3 + rank + step
            conn.attention.begin_step(ControlPayload(step, rank, (AFDDPMetadata(rank, (n,)),)))
            for layer in LAYERS:
                x, ids, weights = routing(rank, step, layer, n, narrow=layer == 2)
                conn.attention.send(layer, 0, x, routing=ExpertRouting(ids, weights))
                result = conn.attention.recv(layer, 0)
                assert torch.equal(result, expert_function(x, ids, weights, layer)), (step, layer)
        stats = conn.attention.stats()
        finished.wait(30)  # every FFN rank is done before any attention rank leaves
        return stats
    finally:
        conn.close()


@pytest.mark.parametrize(("a", "f"), [(1, 2), (2, 2), (2, 3), (1, 1)])
def test_routed_exchanges_are_exact_and_each_rank_gets_only_its_tokens(ranks, port, a, f):
    finished = ranks.context.Barrier(a + f)
    for rank in range(f):
        ranks.start(f"ffn{rank}", run_ffn, port, a, f, rank, finished)
    for rank in range(a):
        ranks.start(f"attn{rank}", run_attention, port, a, f, rank, finished)
    out = ranks.join(60)
    assert all(o.ok for o in out.values()), out
    received = [out[f"ffn{r}"].value["received_rows"] for r in range(f)]
    for r in range(f):
        sent = {layer: 0 for layer in LAYERS}
        for attention in range(a):
            for layer, rows in out[f"attn{attention}"].value["dispatched_rows"][r].items():
                sent[layer] += rows
        assert received[r] == sent
    # Layer 2 routes every token to experts 0..3: a rank whose block lies above gets none.
    placement = ExpertPlacement(E, f)
    for r in range(f):
        if placement.block(r).start >= 4:
            assert received[r][2] == 0
    assert received[0][2] == sum(3 + r + s for r in range(a) for s in range(STEPS))


def ffn_expecting_layer_1(port: int) -> None:
    conn = connect("ffn", 0, port, 1, 2)
    try:
        conn.ffn.recv(conn.ffn.next_step(), 1, 0)
    finally:
        conn.close()


def ffn_one(port: int) -> None:
    conn = connect("ffn", 1, port, 1, 2)
    try:
        step = conn.ffn.next_step()
        conn.ffn.recv(step, 1, 0)
    finally:
        conn.close()


def attention_sending_layer_2(port: int) -> None:
    skip_the_exchange_rule(WIRE.exchange_layers)  # else it refuses layer 2 first itself
    conn = connect("attention", 0, port, 1, 2)
    try:
        conn.attention.begin_step(ControlPayload(5, 0, (AFDDPMetadata(0, (2,)),)))
        x, ids, weights = routing(0, 0, 2, 2, narrow=False)
        conn.attention.send(2, 0, x, routing=ExpertRouting(ids, weights))
        conn.attention.recv(2, 0)
    finally:
        conn.close()


def test_a_mispaired_layer_is_a_protocol_error_naming_both_views(ranks, port):
    ranks.start("ffn0", ffn_expecting_layer_1, port)
    ranks.start("ffn1", ffn_one, port)
    ranks.start("attn", attention_sending_layer_2, port)
    out = ranks.join(40)
    assert out["ffn0"].error_type == "AFDProtocolError", out["ffn0"]
    assert "layer: received 2, expected 1" in out["ffn0"].error
    assert "attention rank 0 (world rank 2)" in out["ffn0"].error
    # The attention rank learns that FFN rank 0 left instead of waiting for it.
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    assert any(
        reports_peer_gone(out["attn"].error, f"FFN rank {f} (world rank {f})", "layer 2 of step 5")
        for f in (0, 1)
    ), out["attn"].error


def ffn_killed_at_layer_2(port: int, rank: int) -> None:
    """FFN rank 1 dies after layer 1; FFN rank 0 serves layer 2, then waits for a step."""
    conn = connect("ffn", rank, port, 1, 2)
    try:
        step = conn.ffn.next_step()
        for layer in (1, 2):
            if layer == 2 and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            batch = conn.ffn.recv(step, layer, 0)
            conn.ffn.send(batch, batch.hidden)
        conn.ffn.next_step()  # ends when the attention rank leaves
    finally:
        conn.close()


def attention_running_one_step(port: int) -> None:
    conn = connect("attention", 0, port, 1, 2)
    try:
        conn.attention.begin_step(ControlPayload(0, 0, (AFDDPMetadata(0, (4,)),)))
        for layer in LAYERS:
            x, ids, weights = routing(0, 0, layer, 4, narrow=False)
            conn.attention.send(layer, 0, x, routing=ExpertRouting(ids, weights))
            conn.attention.recv(layer, 0)
    finally:
        conn.close()


def test_a_killed_ffn_rank_is_named_by_the_attention_rank_without_hanging(ranks, port):
    ranks.start("ffn0", ffn_killed_at_layer_2, port, 0)
    ranks.start("ffn1", ffn_killed_at_layer_2, port, 1)
    ranks.start("attn", attention_running_one_step, port)
    out = ranks.join(40)
    assert out["ffn1"].exitcode == -signal.SIGKILL
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    # FFN rank 1 dies once it has answered layer 1: the attention rank waits for layer 2,
    # or still for FFN rank 0's answer to layer 1. FFN rank 0 fails too (it lost FFN rank
    # 1) and closes; the error names the crashed rank either way.
    assert any(
        reports_peer_gone(out["attn"].error, "FFN rank 1 (world rank 1)", f"layer {n} of step 0")
        for n in (1, 2)
    ), out["attn"].error
    assert out["attn"].elapsed_s < 15  # at once in practice; the bound is 20 s
