"""The CPU reference kernels of the CAM async ops between real processes over gloo.

Each rank opens a :class:`ReferenceOpProvider` of the ``"async"`` family on a test
GroupOpener and calls the ops through ``torch.ops.afd_ascend``. Attention ranks dispatch
both stages of a layer, then combine both; FFN ranks serve each stage's group on a thread
of its own (a lane), taking dispatches from whichever attention rank sends first, and
answer each expanded row with ``row * (global expert + 1)``. The attention ranks check
every combined token exactly against the same sum computed locally (small integers and
power-of-two scales: exact in float32, one rounding to bfloat16 on both sides). Token
counts differ per rank, layer and stage, zero included, and some FFN ranks get no token
of a dispatch (header-only messages).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch

from afd_ascend_ops.reference import ReferenceOpProvider
from afd_ascend_ops.reference.async_group import BATCH_INFO
from afd_core.dataplane.op_provider import GroupSite
from afd_core.kit.pairing import ALL_TO_ALL
from afd_core.topology import Topology
from tests.integration.store_opener import StoreGroupOpener

H, K = 8, 2
LAYERS = (1, 2, 3)
DTYPE = torch.bfloat16
ops = torch.ops.afd_ascend
COMM = torch.zeros(1, dtype=torch.float16)
MAX_TOKENS = 16


def open_rank(
    port: int, a: int, f: int, world_rank: int, stages: int = 1, timeout_s: float = 20.0
) -> tuple[ReferenceOpProvider, tuple[str, ...], Topology]:
    topology = Topology(a, f, ALL_TO_ALL)
    opener = StoreGroupOpener(port, world_rank, topology.world_size, timeout_s)
    provider = ReferenceOpProvider("async")
    site = GroupSite(world_rank, topology.world_size, topology, timeout_s, opener)
    return provider, provider.open(site, stages), topology


def tokens_of(attention_rank: int, layer: int, stage: int) -> int:
    """Tokens attention rank ``attention_rank`` dispatches at (layer, stage): 0 to 4."""
    return (attention_rank * 3 + layer * 2 + stage) % 5


def inputs(attention_rank: int, layer: int, stage: int, experts: int) -> tuple[Any, Any, Any]:
    """Hidden rows, top-k expert ids (distinct per token) and scales of one dispatch."""
    n = tokens_of(attention_rank, layer, stage)
    x = ((torch.arange(n * H).reshape(n, H) % 5) + attention_rank + stage).to(DTYPE)
    first = (torch.arange(n) * (layer + 1) + attention_rank) % experts
    ids = torch.stack([first, (first + 1 + layer % 2) % experts], dim=1).int()
    scales = torch.tensor([0.5, 0.25]).repeat(n, 1) * (stage + 1)
    return x, ids, scales


def expected(x: Any, ids: Any, scales: Any) -> Any:
    """What the attention rank must get: each slot's row * (expert + 1), weighted, summed."""
    rows = x.float().unsqueeze(1) * (ids.float() + 1).unsqueeze(-1)
    return (rows * scales.unsqueeze(-1)).sum(dim=1).to(DTYPE)


def serve_lane(rank: int, a: int, f: int, epr: int, name: str, count: int, seen: list) -> None:
    """Serve ``count`` dispatches on group ``name``: expand, answer, record who sent (or
    the exception that ended the lane)."""
    try:
        answer_dispatches(rank, a, f, epr, name, count, seen)
    except Exception as exc:
        seen.append(exc)


def answer_dispatches(rank: int, a: int, f: int, epr: int, name: str, count: int, seen: list):
    world = (f, a, epr, a + rank, a + f, 1)  # moe_rank_id: attention-first numbering
    for _ in range(count):
        expanded, _, info, counts = ops.afd_async_dispatch_recv(
            torch.empty(1, dtype=DTYPE), COMM, 0, MAX_TOKENS, H, K, *world[:4], world[4], 1,
            0, name,
        )  # fmt: skip
        rows = int(info[BATCH_INFO["rows"]])
        assert rows == int(counts.sum()) and info[5] == info[BATCH_INFO["tokens"]]
        local = torch.repeat_interleave(torch.arange(epr), counts)
        out = expanded[:rows] * (local + rank * epr + 1).unsqueeze(1).to(DTYPE)
        ops.afd_async_combine_send(out, COMM, info, 0, MAX_TOKENS, H, K, *world[:4],
                                   world[4], 1, name)  # fmt: skip
        seen.append((int(info[BATCH_INFO["attention_rank"]]), int(info[BATCH_INFO["layer"]]),
                     rows))  # fmt: skip


def serve(port: int, a: int, f: int, rank: int, stages: int, epr: int, done: Any) -> list:
    """An FFN rank: one lane thread per stage; returns (sender, layer, rows) served."""
    provider, names, _ = open_rank(port, a, f, rank, stages)
    seen: list = []
    try:
        lanes = [
            threading.Thread(
                target=serve_lane, args=(rank, a, f, epr, names[s], a * len(LAYERS), seen)
            )
            for s in range(stages)
        ]
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join(60)
        assert not any(lane.is_alive() for lane in lanes)
        for failure in (s for s in seen if isinstance(s, Exception)):
            raise failure
        done.wait(30)
        return seen
    finally:
        provider.close()


def attend(port: int, a: int, f: int, rank: int, stages: int, epr: int, done: Any) -> int:
    """An attention rank: both stages' dispatch, then both combines; checks every token."""
    role_rank = rank - f
    provider, names, _ = open_rank(port, a, f, rank, stages)
    got = 0
    try:
        for layer in LAYERS:
            sent = []
            for stage in range(stages):
                x, ids, scales = inputs(role_rank, layer, stage, f * epr)
                ops.afd_async_dispatch_send(
                    x, ids, COMM, 0, MAX_TOKENS, x.shape[0], H, K, f, a, epr, role_rank, a + f,
                    layer, 1, 0, names[stage],
                )  # fmt: skip
                sent.append((x, ids, scales))
            for stage, (x, ids, scales) in enumerate(sent):
                y = ops.afd_async_combine_recv(torch.empty(1, dtype=DTYPE), ids, scales, COMM, 0,
                                               x.shape[0], H, K, f, a, epr, role_rank, a + f,
                                               names[stage])  # fmt: skip
                assert y.dtype == DTYPE and torch.equal(y, expected(x, ids, scales)), (layer, stage)
                got += y.shape[0]
        done.wait(30)
        return got
    finally:
        provider.close()


@pytest.mark.parametrize(("f", "a", "stages"), [(1, 1, 1), (2, 2, 2), (2, 1, 2)],
                         ids=["1A1F", "2A2F-two-stages", "1A2F-two-stages"])  # fmt: skip
def test_each_token_gets_its_weighted_experts_back_from_every_owner(ranks, port, f, a, stages):
    epr = 3
    done = ranks.context.Barrier(a + f)
    for rank in range(f):
        ranks.start(f"ffn{rank}", serve, port, a, f, rank, stages, epr, done)
    for rank in range(f, f + a):
        ranks.start(f"attn{rank - f}", attend, port, a, f, rank, stages, epr, done)
    out = ranks.join(90)
    assert all(o.ok for o in out.values()), out
    tokens = sum(
        tokens_of(r, layer, s) for r in range(a) for layer in LAYERS for s in range(stages)
    )
    assert sum(out[f"attn{r}"].value for r in range(a)) == tokens
    # Every (token, expert) pair reached exactly its owner; every dispatch was answered by
    # every FFN rank, header-only where it had no token there.
    for rank in range(f):
        seen = out[f"ffn{rank}"].value
        assert len(seen) == a * len(LAYERS) * stages
    rows = sum(r for rank in range(f) for _, _, r in out[f"ffn{rank}"].value)
    assert rows == K * tokens
    assert f == 1 or any(r == 0 for rank in range(f) for _, _, r in out[f"ffn{rank}"].value)


# -- mispaired calls and shutdown ------------------------------------------------------


def mispaired_ffn(port: int, fault: str, done: Any) -> str:
    provider, (name,), _ = open_rank(port, 1, 1, 0, timeout_s=10.0)
    try:
        out = ops.afd_async_dispatch_recv(torch.empty(1, dtype=DTYPE), COMM, 0, MAX_TOKENS, H, K,
                                          1, 1, 4, 1, 2, 1, 0, name)  # fmt: skip
        ops.afd_async_combine_send(out[0], COMM, out[2], 0, MAX_TOKENS, H, K, 1, 1, 4, 1, 2, 1,
                                   name)  # fmt: skip
        if fault == "answered twice":
            ops.afd_async_combine_send(out[0], COMM, out[2], 0, MAX_TOKENS, H, K, 1, 1, 4, 1, 2,
                                       1, name)  # fmt: skip
        return "served"
    finally:
        done.wait(20)
        provider.close()


def mispaired_attention(port: int, fault: str, done: Any) -> str:
    provider, (name,), _ = open_rank(port, 1, 1, 1, timeout_s=10.0)
    try:
        hidden = H + 1 if fault == "hidden_size" else H
        x = torch.ones(3, hidden, dtype=DTYPE)
        ids = torch.tensor([[0, 1], [1, 2], [3, 0]], dtype=torch.int32)
        ops.afd_async_dispatch_send(x, ids, COMM, 0, MAX_TOKENS, 3, hidden, K, 1, 1, 4, 0, 2, 5,
                                    1, 0, name)  # fmt: skip
        if fault == "dispatched twice":
            ops.afd_async_dispatch_send(x, ids, COMM, 0, MAX_TOKENS, 3, hidden, K, 1, 1, 4, 0, 2,
                                        6, 1, 0, name)  # fmt: skip
        scales = torch.ones(3, K)
        ops.afd_async_combine_recv(x[:1, 0], ids, scales, COMM, 0, 3, hidden, K, 1, 1, 4, 0, 2,
                                   name)  # fmt: skip
        return "combined"
    finally:
        done.wait(20)
        provider.close()


@pytest.mark.parametrize(
    ("fault", "who", "says"),
    [
        ("hidden_size", "ffn", "hidden_size: sent 9, expected 8"),
        ("dispatched twice", "attn", "dispatches layer 6 before combine_recv received layer 5"),
        ("answered twice", "ffn", "answers no dispatch FFN rank 0 (world rank 0) received"),
    ],
)
def test_a_mispaired_call_is_a_protocol_error_naming_both_sides(ranks, port, fault, who, says):
    done = ranks.context.Barrier(2)
    ranks.start("ffn", mispaired_ffn, port, fault, done)
    ranks.start("attn", mispaired_attention, port, fault, done)
    out = ranks.join(60)
    assert out[who].error_type == "AFDProtocolError", out
    assert says in out[who].error
    if fault == "hidden_size":
        assert "attention rank 0 (world rank 1)" in out[who].error


def idle_ffn(port: int, how: str) -> list[str]:
    """An FFN rank waiting for a dispatch nobody sends; another thread interrupts or
    closes its provider after 0.5 s (the prior art's async FFN teardown blocked here).
    Returns the error types of the blocked call and of one call after it."""
    provider, (name,), _ = open_rank(port, 1, 1, 0, timeout_s=60.0)
    try:
        threading.Timer(0.5, getattr(provider, how)).start()
        errors = []
        for _ in range(2):
            try:
                ops.afd_async_dispatch_recv(torch.empty(1, dtype=DTYPE), COMM, 0, MAX_TOKENS, H,
                                            K, 1, 1, 4, 1, 2, 1, 0, name)  # fmt: skip
            except Exception as exc:
                errors.append(type(exc).__name__)
        return errors
    finally:
        provider.close()


def silent_attention(port: int, exits: bool) -> None:
    provider, _, _ = open_rank(port, 1, 1, 1, timeout_s=60.0)
    if exits:
        os._exit(3)  # without closing: the FFN rank's receive sees the connection go
    threading.Event().wait(3)
    provider.close()


@pytest.mark.parametrize("how", ["interrupt", "close"])
def test_closing_wakes_an_ffn_rank_blocked_in_its_receive(ranks, port, how):
    ranks.start("ffn", idle_ffn, port, how)
    ranks.start("attn", silent_attention, port, False)
    out = ranks.join(30)
    assert out["ffn"].ok, out
    assert out["ffn"].value == ["AFDShutdown", "AFDShutdown"]


def test_an_attention_rank_that_exits_ends_the_ffn_ranks_idle_receive(ranks, port):
    ranks.start("ffn", idle_ffn_until_error, port)
    ranks.start("attn", silent_attention, port, True)
    out = ranks.join(40)
    assert out["attn"].exitcode == 3
    assert out["ffn"].error_type == "AFDPeerError", out["ffn"]
    assert "closed the connection during the next dispatch on group" in out["ffn"].error


def idle_ffn_until_error(port: int) -> None:
    provider, (name,), _ = open_rank(port, 1, 1, 0, timeout_s=60.0)
    try:
        ops.afd_async_dispatch_recv(torch.empty(1, dtype=DTYPE), COMM, 0, MAX_TOKENS, H, K, 1, 1,
                                    4, 1, 2, 1, 0, name)  # fmt: skip
    finally:
        provider.close()
