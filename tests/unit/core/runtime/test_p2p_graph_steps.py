"""Graph steps of the P2P protocol: header-less messages on caller-owned buffers.

Runs over the in-process loopback of :mod:`tests.unit.core.loopback`, whose connectors
have a recording replay guard (eager: nothing is captured here; the CUDA capture of the
same calls is covered by tests/e2e_gpu/test_nccl_connector.py).
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import WireSpec  # noqa: E402
from afd_core.errors import AFDProtocolError  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from tests.unit.core.loopback import close_all, loopback_connectors  # noqa: E402

#: Layer 0 is dense (no router logits), layer 1 carries them.
GATED = WireSpec(
    hidden_size=4,
    dtype="bfloat16",
    num_exchange_layers=2,
    router_logits_width=3,
    router_logits_dtype="float32",
    dense_layers=(0,),
)


def graph_payload(step: int, rank: int, n: int, *, capturing: bool = False) -> ControlPayload:
    return ControlPayload(
        step, rank, (AFDDPMetadata(rank, (n,)),), is_graph_capturing=capturing, is_graph_step=True
    )


def world(a: int, f: int, wire: WireSpec):
    return loopback_connectors(a, f, wire, gate=True, graph_steps=True)


def wait_ready(conn, ranks: tuple[int, ...]) -> None:
    inbox = conn.ffn._inbox
    deadline = time.monotonic() + 5
    while inbox.ready_ranks() != ranks:  # receiver threads queue payloads
        assert time.monotonic() < deadline, inbox.ready_ranks()
        time.sleep(0.01)


def test_a_graph_step_of_two_ranks_moves_bare_tensors_into_the_callers_buffers():
    attention, (ffn,) = world(2, 1, GATED)
    try:
        counts = (2, 3)
        inputs = [
            torch.full((n, 4), float(r + 1), dtype=torch.bfloat16) for r, n in enumerate(counts)
        ]
        logits = [torch.full((n, 3), 0.5 * (r + 1)) for r, n in enumerate(counts)]
        # The attention side's calls of a capture step, run eagerly (nothing captures
        # here), move the data that a replay of the captured graph moves.
        for conn, n in zip(attention, counts, strict=True):
            conn.attention.begin_step(graph_payload(0, conn.role_rank, n, capturing=True))
        wait_ready(ffn, (0, 1))
        step = ffn.ffn.next_step()
        assert step.is_graph_step and step.is_graph_capturing
        hidden = torch.zeros(5, 4, dtype=torch.bfloat16)
        router_logits = torch.zeros(5, 3)
        for layer in range(2):
            width = GATED.logits_width_at(layer)
            for conn, x, lg in zip(attention, inputs, logits, strict=True):
                conn.attention.send(layer, 0, x, router_logits=lg if width else None)
            ffn.ffn.recv_into(step, layer, 0, hidden, router_logits if width else None)
            assert torch.equal(hidden, torch.cat(inputs))
            if width:
                assert torch.equal(router_logits, torch.cat(logits))
            ffn.ffn.send_from(step, layer, 0, hidden * 10 + layer)
            for conn, x in zip(attention, inputs, strict=True):
                assert torch.equal(conn.attention.recv(layer, 0), x * 10 + layer)
        # A graph step is complete after its layers: the next (eager) step may start, after
        # draining the replays still running.
        attention[0].attention.begin_step(ControlPayload(1, 0, (AFDDPMetadata(0, (1,)),)))
        assert attention[0].replays.calls == [("drain", "eager step 1")]
    finally:
        close_all(attention, [ffn])


def test_a_replay_exchanges_nothing_on_the_host_and_the_next_step_may_follow():
    (attn,), (ffn,) = world(1, 1, GATED)
    try:
        attn.attention.begin_step(graph_payload(0, 0, 4))
        attn.attention.watch_graph_replay(0)
        attn.attention.begin_step(graph_payload(1, 0, 4))  # replays: no host exchange
        first, second = ffn.ffn.next_step(), ffn.ffn.next_step()
        assert [s.payloads[0].step_id for s in (first, second)] == [0, 1]
        assert attn.replays.calls == [("watch", 0)]
        with pytest.raises(AFDProtocolError, match="makes no layer exchange through the endpoint"):
            attn.attention.send(0, 0, torch.zeros(4, 4, dtype=torch.bfloat16))

    finally:
        close_all([attn], [ffn])


def test_a_capture_step_must_exchange_every_layer():
    (attn,), (ffn,) = world(1, 1, GATED)
    try:
        attn.attention.begin_step(graph_payload(2, 0, 4, capturing=True))
        with pytest.raises(AFDProtocolError, match=r"after 0 of the 2 layer exchanges of step 2"):
            attn.attention.begin_step(graph_payload(3, 0, 4))
    finally:
        close_all([attn], [ffn])


def test_the_ffn_rank_forms_steps_of_one_kind_only():
    attention, (ffn,) = world(2, 1, GATED)
    try:
        attention[0].attention.begin_step(graph_payload(0, 0, 2))
        attention[1].attention.begin_step(ControlPayload(0, 1, (AFDDPMetadata(1, (3,)),)))
        wait_ready(ffn, (0, 1))
        graph_step = ffn.ffn.next_step()
        assert graph_step.attention_ranks == (0,) and graph_step.is_graph_step
        eager_step = ffn.ffn.next_step()
        assert eager_step.attention_ranks == (1,) and not eager_step.is_graph_step
    finally:
        close_all(attention, [ffn])


def test_graph_buffers_of_the_wrong_shape_are_refused():
    (attn,), (ffn,) = world(1, 1, GATED)
    try:
        attn.attention.begin_step(graph_payload(0, 0, 2))
        step = ffn.ffn.next_step()
        with pytest.raises(AFDProtocolError, match=r"needs a contiguous \(2, 4\) tensor"):
            ffn.ffn.recv_into(step, 0, 0, torch.zeros(3, 4, dtype=torch.bfloat16), None)
    finally:
        close_all([attn], [ffn])


def test_router_logits_must_be_given_exactly_where_the_layer_carries_them():
    (attn,), (ffn,) = world(1, 1, GATED)
    try:
        attn.attention.begin_step(graph_payload(0, 0, 2))
        step = ffn.ffn.next_step()
        with pytest.raises(AFDProtocolError, match="pass router_logits exactly when"):
            ffn.ffn.recv_into(step, 1, 0, torch.zeros(2, 4, dtype=torch.bfloat16), None)
    finally:
        close_all([attn], [ffn])


def test_recv_into_refuses_an_eager_step():
    (attn,), (ffn,) = world(1, 1, GATED)
    try:
        attn.attention.begin_step(ControlPayload(0, 0, (AFDDPMetadata(0, (2,)),)))
        step = ffn.ffn.next_step()
        with pytest.raises(AFDProtocolError, match="is not a CUDA graph step"):
            ffn.ffn.recv_into(step, 0, 0, torch.zeros(2, 4, dtype=torch.bfloat16), None)
    finally:
        close_all([attn], [ffn])
