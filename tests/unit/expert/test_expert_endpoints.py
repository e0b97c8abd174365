"""The expert-routed endpoints and step relay over the in-process loopback transport.

Real composed connectors (control sender, FFN rank 0's inbox and relay, expert endpoints)
on :mod:`tests.unit.core.loopback`. Each FFN rank applies a known function per expert
(expert ``e`` multiplies by ``e + 1``) to the rows it gets; the attention ranks check the
combined results exactly (integer data, float32).
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import ExpertRouting, WireSpec  # noqa: E402
from afd_core.errors import AFDPeerError, AFDProtocolError  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from tests.unit.core.loopback import DATA_PLANES, close_all, loopback_connectors  # noqa: E402

E, K, H = 8, 2, 4
WIRE = WireSpec(
    hidden_size=H,
    dtype="float32",
    num_exchange_layers=2,
    router_logits_width=E,
    num_experts=E,
    top_k=K,
    exchange_layer_ids=(1, 2),
)


def payload(rank: int, step: int, *counts: int) -> ControlPayload:
    return ControlPayload(step, rank, tuple(AFDDPMetadata(rank, (n,)) for n in counts))


def expected(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return sum(weights[:, j : j + 1] * x * (ids[:, j : j + 1].float() + 1) for j in range(K))


def serve(conn, steps: int, seen: list) -> None:
    """FFN rank: ``steps`` steps of every layer; expert ``e`` multiplies by ``e + 1``."""
    block = conn.ffn.block
    for _ in range(steps):
        step = conn.ffn.next_step()
        seen.append(step.attention_ranks)
        for layer in WIRE.exchange_layers:
            batch = conn.ffn.recv(step, layer, 0)
            ids, weights = batch.routing.topk_ids, batch.routing.topk_weights
            out = torch.zeros_like(batch.hidden)
            for j in range(K):
                out += weights[:, j : j + 1] * batch.hidden * (ids[:, j : j + 1] + block.start + 1)
            conn.ffn.send(batch, out)


def run_world(
    a: int, f: int, routes: dict[int, list[torch.Tensor]], data_plane: str = "short-receives"
) -> tuple[list, list]:
    """Every attention rank sends one step: per layer, tokens with the given expert ids
    (``data_plane``: one of the loopback's ``DATA_PLANES``)."""
    attention, ffn = loopback_connectors(a, f, WIRE, exchange="expert", data_plane=data_plane)
    seen: list[list] = [[] for _ in range(f)]
    threads = [threading.Thread(target=serve, args=(c, 1 if a == 1 else a, seen[i]))
               for i, c in enumerate(ffn)]  # fmt: skip
    results = []
    try:
        for t in threads:
            t.start()
        for conn in attention:
            ids_per_layer = routes[conn.role_rank]
            n = ids_per_layer[0].shape[0]
            conn.attention.begin_step(payload(conn.role_rank, 0, n))
            for layer, ids in zip(WIRE.exchange_layers, ids_per_layer, strict=True):
                x = torch.arange(n * H, dtype=torch.float32).view(n, H) + layer
                weights = torch.full((n, K), 0.5)
                conn.attention.send(layer, 0, x, routing=ExpertRouting(ids, weights))
                out = conn.attention.recv(layer, 0)
                results.append(torch.equal(out, expected(x, ids, weights)))
        for t in threads:
            t.join(10)
        return results, [c.attention.stats() for c in attention] + [c.ffn.stats() for c in ffn]
    finally:
        close_all(attention, ffn)


def ids(*rows: tuple[int, int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("data_plane", DATA_PLANES)
def test_each_rank_gets_only_rows_with_its_experts_and_the_sums_are_exact(data_plane):
    routes = {0: [ids((0, 1), (0, 5), (6, 7)), ids((2, 3), (4, 4), (1, 7))]}
    results, (sent, ffn0, ffn1) = run_world(1, 2, routes, data_plane)
    assert results == [True, True]
    assert sent["dispatched_rows"] == {0: {1: 2, 2: 2}, 1: {1: 2, 2: 2}}
    assert ffn0["expert_block"] == [0, 4] and ffn1["expert_block"] == [4, 8]
    assert ffn0["received_rows"] == {1: 2, 2: 2} and ffn1["received_rows"] == {1: 2, 2: 2}


@pytest.mark.parametrize("data_plane", DATA_PLANES)
def test_a_rank_that_gets_no_row_of_a_layer_still_takes_part_in_it(data_plane):
    # Layer 1: every token on FFN rank 0; layer 2: every token on FFN rank 2.
    routes = {0: [ids((0, 1), (2, 1)), ids((7, 6), (6, 7))]}
    results, stats = run_world(1, 3, routes, data_plane)  # blocks 0..2 | 3..5 | 6..7
    assert results == [True, True]
    assert [s["received_rows"] for s in stats[1:]] == [{1: 2, 2: 0}, {1: 0, 2: 0}, {1: 0, 2: 2}]


def test_two_attention_ranks_run_the_same_steps_on_every_ffn_rank():
    routes = {0: [ids((0, 4)), ids((1, 5))], 1: [ids((3, 7), (2, 6)), ids((0, 1), (6, 7))]}
    attention, ffn = loopback_connectors(2, 2, WIRE, exchange="expert")
    try:
        for conn in attention:  # both announce before any FFN rank looks
            conn.attention.begin_step(
                payload(conn.role_rank, 0, routes[conn.role_rank][0].shape[0])
            )
        steps = [None, None]

        def take(i: int) -> None:
            steps[i] = ffn[i].ffn.next_step()

        threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert steps[0] is not None
        assert steps[0] == steps[1]  # the follower runs the step the leader formed
        # Whichever payloads the leader's inbox threads had queued (thread timing).
        assert steps[0].attention_ranks in ((0, 1), (0,), (1,))
    finally:
        close_all(attention, ffn)


def test_an_expert_routed_send_without_routing_or_of_another_width_is_refused():
    (attn,), ffn = loopback_connectors(1, 2, WIRE, exchange="expert")
    try:
        attn.attention.begin_step(payload(0, 0, 2))
        with pytest.raises(AFDProtocolError, match="needs the routing of every MoE layer"):
            attn.attention.send(1, 0, torch.zeros(2, H))
    finally:
        close_all([attn], ffn)
    (attn,), ffn = loopback_connectors(1, 2, WIRE, exchange="expert")
    try:
        attn.attention.begin_step(payload(0, 0, 2))
        routing = ExpertRouting(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 3))
        with pytest.raises(AFDProtocolError, match=r"the step and wire spec say \(2, 2\)"):
            attn.attention.send(1, 0, torch.zeros(2, H), routing=routing)
        with pytest.raises(AFDProtocolError, match="failed earlier"):
            attn.attention.send(2, 0, torch.zeros(2, H), routing=routing)
    finally:
        close_all([attn], ffn)


def test_a_dense_layer_is_not_an_exchange_layer():
    (attn,), ffn = loopback_connectors(1, 1, WIRE, exchange="expert")
    try:
        attn.attention.begin_step(payload(0, 0, 1))
        routing = ExpertRouting(ids((0, 1)), torch.ones(1, K))
        with pytest.raises(AFDProtocolError, match=r"layer 0 is not an exchange layer"):
            attn.attention.send(0, 0, torch.zeros(1, H), routing=routing)
    finally:
        close_all([attn], ffn)


def test_both_sides_refuse_a_layer_out_of_order_naming_both_layers():
    (attn,), ffn = loopback_connectors(1, 1, WIRE, exchange="expert")
    try:
        attn.attention.begin_step(payload(0, 0, 1))
        routing = ExpertRouting(ids((0, 1)), torch.ones(1, K))
        with pytest.raises(AFDProtocolError, match=r"attention rank 0 exchanged layer 2 .* "
                           r"where layer 1 \(exchange 1 of 2\)"):  # fmt: skip
            attn.attention.send(2, 0, torch.zeros(1, H), routing=routing)
        step = ffn[0].ffn.next_step()
        with pytest.raises(
            AFDProtocolError, match=r"FFN rank 0 exchanged layer 2 .* where layer 1"
        ):
            ffn[0].ffn.recv(step, 2, 0)
    finally:
        close_all([attn], ffn)


def test_an_attention_rank_that_leaves_is_named_by_the_ffn_ranks():
    (attn,), ffn = loopback_connectors(1, 2, WIRE, exchange="expert")
    try:
        attn.close()
        with pytest.raises(AFDPeerError, match=r"attention rank 0 \(world rank 2\) closed"):
            ffn[0].ffn.next_step()
    finally:
        close_all([attn], ffn)
