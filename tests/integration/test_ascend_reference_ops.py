"""The CPU reference kernels of ``afd_ascend::a2e``/``e2a`` between real processes over gloo.

Each rank opens a :class:`ReferenceOpProvider` on a test GroupOpener (a TCPStore, gloo
transports on PrefixStores) and calls the ops through ``torch.ops.afd_ascend``. The FFN
ranks serve layer-major (for each layer, for each stage: a2e, then e2a) and compute
``x * 2 + ffn_rank + 1``; attention ranks send both stages of a layer before receiving
either, and check every row that comes back exactly (small integers in bfloat16). Row
counts differ per attention rank, layer and stage, zero included.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch

from afd_ascend_ops.reference import ReferenceOpProvider
from afd_core.dataplane.op_provider import GroupSite
from afd_core.topology import Topology
from tests.integration.peer_errors import reports_peer_gone
from tests.integration.store_opener import StoreGroupOpener

H, K, E = 8, 2, 6
LAYERS = 3
DTYPE = torch.bfloat16
ops = torch.ops.afd_ascend


def open_rank(
    port: int, a: int, f: int, world_rank: int, stages: int = 1, timeout_s: float = 20.0
) -> tuple[ReferenceOpProvider, tuple[str, ...], Topology]:
    topology = Topology(a, f)
    opener = StoreGroupOpener(port, world_rank, topology.world_size, timeout_s)
    provider = ReferenceOpProvider()
    site = GroupSite(world_rank, topology.world_size, topology, timeout_s, opener)
    return provider, provider.open(site, stages), topology


def rows_of(attention_rank: int, layer: int, stage: int) -> int:
    """Rows attention rank ``attention_rank`` sends at (layer, stage): 0 to 4, unequal."""
    return (attention_rank * 3 + layer * 2 + stage) % 5


def inputs(attention_rank: int, layer: int, stage: int) -> tuple[Any, Any, Any]:
    """The hidden rows, expert ids and scales of one attention rank at (layer, stage)."""
    n = rows_of(attention_rank, layer, stage)
    base = torch.arange(n * H).reshape(n, H) % 7
    x = (base + attention_rank + layer + stage).to(DTYPE)
    ids = ((torch.arange(n * K).reshape(n, K) + attention_rank) % E).int()
    scales = torch.full((n, K), 0.25 * (attention_rank + 1 + stage))
    return x, ids, scales


def serve(port: int, a: int, f: int, rank: int, stages: int, gate: int, done: Any) -> int:
    """An FFN rank: layer-major, checks every input it receives; returns rows served."""
    provider, names, topology = open_rank(port, a, f, rank, stages)
    block = topology.block_of(rank)
    blocks = -(-a // f)
    served = 0
    try:
        for layer in range(LAYERS):
            for stage in range(stages):
                counts = [rows_of(src, layer, stage) for src in block]
                batch = sum(counts)
                out = ops.a2e(torch.empty(0, H, dtype=DTYPE), None, None, batch, H, K, f, a,
                              rank, names[stage], 0, gate)  # fmt: skip
                sent = [inputs(src, layer, stage) for src in block]
                assert torch.equal(out[0], torch.cat([s[0] for s in sent]))
                assert out[3].tolist() == counts + [0] * (blocks - len(counts))
                assert out[4].dtype == torch.bool and out[4].shape == (batch,) and out[4].all()
                if gate:
                    assert torch.equal(out[1], torch.cat([s[1] for s in sent]))
                    assert torch.equal(out[2], torch.cat([s[2] for s in sent]))
                else:
                    assert out[1].shape == out[2].shape == (1, 1)
                result = out[0] * 2 + rank + 1
                ops.e2a(result, out[3], batch, H, K, f, a, rank, names[stage], 0)
                served += batch
        done.wait(30)  # the last results reach the attention ranks before the groups go
        return served
    finally:
        provider.close()


def attend(port: int, a: int, f: int, rank: int, stages: int, gate: int, done: Any) -> int:
    """An attention rank: both stages' a2e, then both e2a; checks every row; returns rows."""
    role_rank = rank - f
    provider, names, topology = open_rank(port, a, f, rank, stages)
    ffn_rank = topology.ffn_rank_of(role_rank)
    blocks = -(-a // f)
    got = 0
    try:
        for layer in range(LAYERS):
            sent = []
            for stage in range(stages):
                x, ids, scales = inputs(role_rank, layer, stage)
                out = ops.a2e(x, ids if gate else None, scales if gate else None, x.shape[0], H,
                              K, f, a, rank, names[stage], 0, gate)  # fmt: skip
                assert out[3].shape == (blocks,) and int(out[3].sum()) == x.shape[0]
                sent.append((x, out[3]))
            for stage, (x, counts) in enumerate(sent):
                y = ops.e2a(x, counts, x.shape[0], H, K, f, a, rank, names[stage], 0)
                assert y.dtype == DTYPE and torch.equal(y, x * 2 + ffn_rank + 1), (layer, stage)
                got += y.shape[0]
        done.wait(30)
        return got
    finally:
        provider.close()


@pytest.mark.parametrize(
    ("f", "a", "stages", "gate"),
    [(1, 2, 2, 1), (2, 2, 2, 0), (2, 3, 1, 0)],
    ids=["1F2A-two-stages-gated", "2F2A-two-stages", "2F3A-uneven-blocks"],
)
def test_rows_round_trip_to_exactly_their_sender(ranks, port, f, a, stages, gate):
    done = ranks.context.Barrier(a + f)
    for rank in range(f):
        ranks.start(f"ffn{rank}", serve, port, a, f, rank, stages, gate, done)
    for rank in range(f, f + a):
        ranks.start(f"attn{rank - f}", attend, port, a, f, rank, stages, gate, done)
    out = ranks.join(90)
    assert all(o.ok for o in out.values()), out
    expected = sum(
        rows_of(src, layer, stage)
        for src in range(a)
        for layer in range(LAYERS)
        for stage in range(stages)
    )
    assert sum(out[f"ffn{r}"].value for r in range(f)) == expected
    assert sum(out[f"attn{r}"].value for r in range(a)) == expected
    assert expected > 0 and any(
        rows_of(src, layer, stage) == 0
        for src in range(a)
        for layer in range(LAYERS)
        for stage in range(stages)
    )


# -- mispaired calls -------------------------------------------------------------------


def mispaired_ffn(port: int, fault: str, done: Any) -> None:
    provider, (name,), _ = open_rank(port, 1, 1, 0, timeout_s=10.0)
    try:
        extra = 1 if fault == "batch_size" else 0
        out = ops.a2e(torch.empty(0, H, dtype=DTYPE), None, None, 3 + extra, H, K, 1, 1, 0, name)
        ops.e2a(out[0], out[3], 3, H, K, 1, 1, 0, name)
        if fault == "sequence":
            ops.e2a(out[0], out[3], 3, H, K, 1, 1, 0, name)  # one e2a too many
        ops.a2e(torch.empty(0, H, dtype=DTYPE), None, None, 3, H, K, 1, 1, 0, name)
    finally:
        if fault == "sequence":
            done.wait(20)  # the extra e2a reaches the attention rank before the group goes
        provider.close()


def mispaired_attention(port: int, fault: str, done: Any) -> None:
    provider, (name,), _ = open_rank(port, 1, 1, 1, timeout_s=10.0)
    try:
        hidden = H + 1 if fault == "hidden_size" else H
        for _ in range(2):
            x = torch.ones(3, hidden, dtype=DTYPE)
            out = ops.a2e(x, None, None, 3, hidden, K, 1, 1, 1, name)
            ops.e2a(x, out[3], 3, hidden, K, 1, 1, 1, name)
    finally:
        if fault == "sequence":
            done.wait(20)
        provider.close()


@pytest.mark.parametrize(
    ("fault", "ffn_says"),
    [
        ("hidden_size", "hidden_size: sent 9, expected 8"),
        ("batch_size", "sent 3 rows (attention rank 0 (world rank 1): 3), but its a2e "
                       "expects batch_size=4"),
        ("sequence", "seq: sent 2, expected 3"),
    ],
)  # fmt: skip
def test_a_mispaired_call_is_a_protocol_error_naming_both_sides(ranks, port, fault, ffn_says):
    done = ranks.context.Barrier(2)
    ranks.start("ffn", mispaired_ffn, port, fault, done)
    ranks.start("attn", mispaired_attention, port, fault, done)
    out = ranks.join(60)
    ffn = out["ffn"]
    assert ffn.error_type == "AFDProtocolError", ffn
    assert ffn_says in ffn.error
    assert "FFN rank 0 (world rank 0)" in ffn.error
    assert "attention rank 0 (world rank 1)" in ffn.error
    attn = out["attn"]
    if fault == "sequence":
        # The FFN's extra e2a reached the attention rank where it waited for the next one.
        assert attn.error_type == "AFDProtocolError", attn
        assert "seq: sent 2, expected 3" in attn.error
        assert "the message FFN rank 0 (world rank 0) sent" in attn.error
    else:
        # The FFN rank failed and left: the attention rank learns it, it does not hang.
        assert attn.error_type == "AFDPeerError", attn
        assert "FFN rank 0 (world rank 0)" in attn.error


# -- shutdown and lost peers -----------------------------------------------------------


def blocked_rank(port: int, world_rank: int, blocked: bool, how: str, done: Any) -> list[str]:
    """The blocked rank waits in an op that never completes until another thread of it
    interrupts (or closes) its provider; the other rank only waits for it to finish.
    Returns the error types of the blocked call and of one call after it."""
    provider, (name,), _ = open_rank(port, 1, 1, world_rank, timeout_s=60.0)
    try:
        if not blocked:
            done.wait(30)
            return []
        stop = getattr(provider, how)
        threading.Timer(0.5, stop).start()
        x = torch.ones(2, H, dtype=DTYPE)
        errors = []
        for _ in range(2):
            try:
                if world_rank == 0:
                    ops.a2e(x, None, None, 2, H, K, 1, 1, 0, name)  # nobody sends
                else:
                    out = ops.a2e(x, None, None, 2, H, K, 1, 1, 1, name)
                    ops.e2a(x, out[3], 2, H, K, 1, 1, 1, name)  # nobody answers
            except Exception as exc:
                errors.append(type(exc).__name__)
        done.wait(30)
        return errors
    finally:
        provider.close()


@pytest.mark.parametrize("how", ["interrupt", "close"])
@pytest.mark.parametrize("blocked_role", ["ffn", "attention"])
def test_interrupt_or_close_from_another_thread_wakes_a_blocked_op(ranks, port, how, blocked_role):
    done = ranks.context.Barrier(2)
    ranks.start("ffn", blocked_rank, port, 0, blocked_role == "ffn", how, done)
    ranks.start("attn", blocked_rank, port, 1, blocked_role == "attention", how, done)
    out = ranks.join(45)
    assert all(o.ok for o in out.values()), out
    blocked = out["ffn" if blocked_role == "ffn" else "attn"]
    assert blocked.value == ["AFDShutdown", "AFDShutdown"]


def leaving_rank(port: int, world_rank: int, leaves: bool) -> None:
    """The leaving rank exits without closing after one layer (the FFN rank before it
    answers); the other one waits for it: the FFN rank for the next layer, the attention
    rank for its result."""
    provider, (name,), _ = open_rank(port, 1, 1, world_rank, timeout_s=5.0)
    try:
        x = torch.ones(2, H, dtype=DTYPE)
        if world_rank == 0:
            out = ops.a2e(x, None, None, 2, H, K, 1, 1, 0, name)
            if leaves:
                os._exit(3)
            ops.e2a(out[0], out[3], 2, H, K, 1, 1, 0, name)
            ops.a2e(x, None, None, 2, H, K, 1, 1, 0, name)  # the attention rank is gone
        else:
            out = ops.a2e(x, None, None, 2, H, K, 1, 1, 1, name)
            ops.e2a(x, out[3], 2, H, K, 1, 1, 1, name)  # the FFN rank may be gone
            if leaves:
                os._exit(3)
    finally:
        provider.close()


@pytest.mark.parametrize("leaver", ["ffn", "attention"])
def test_a_peer_that_exits_is_a_peer_error_naming_it(ranks, port, leaver):
    ranks.start("ffn", leaving_rank, port, 0, leaver == "ffn")
    ranks.start("attn", leaving_rank, port, 1, leaver == "attention")
    out = ranks.join(40)
    if leaver == "ffn":
        assert out["ffn"].exitcode == 3
        waiter, peer, doing = out["attn"], "FFN rank 0 (world rank 0)", "e2a call 1"
    else:
        assert out["attn"].exitcode == 3
        waiter, peer, doing = out["ffn"], "attention rank 0 (world rank 1)", "a2e call 2"
    assert waiter.error_type == "AFDPeerError", waiter
    timed_out = f"AFD: {peer} did not answer within 5 s ({doing} on group" in waiter.error
    assert timed_out or reports_peer_gone(waiter.error, peer, doing), waiter.error
