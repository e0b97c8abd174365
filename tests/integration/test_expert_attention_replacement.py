"""An attention rank of ExpertRoutedAFDConnector (gloo) leaves and a new server takes its seat.

Real processes over real gloo, 2A2F: every attention rank has a link of its own with
every FFN rank, and the FFN ranks relay steps over a group of their own. When attention
rank 1 closes its connector or is killed in the middle of a step, both FFN ranks let its
links go and keep serving attention rank 0 exactly (its routed results are checked
every layer); the server that replaces rank 1 is linked by both FFN ranks and its
results are exact too. With no attention rank left, FFN rank 0 fails after its idle
limit and FFN rank 1 with it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import torch

from afd_core.connector import ExpertRouting
from afd_core.errors import AFDPeerError
from afd_core.runtime.seats import VACANCY_WAIT_S
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from tests.integration.test_expert_routed_gloo import LAYERS, connect, expert_function, routing

IDLE_LIMIT_S = 60
A, F = 2, 2


def serve_step(conn: Any, step: Any) -> None:
    """Every layer of ``step``: this FFN rank's experts applied to the rows it got."""
    first = conn.ffn.block.start
    for layer in LAYERS:
        batch = conn.ffn.recv(step, layer, 0)
        r = batch.routing
        out = expert_function(batch.hidden, r.topk_ids + first, r.topk_weights, layer)
        conn.ffn.send(batch, out)


def serve_until(port: int, rank: int, stop: Any) -> dict[str, Any]:
    """FFN rank ``rank``: serve steps until ``stop`` is set; its endpoint's stats and the
    attention ranks of every step served."""
    conn = connect("ffn", rank, port, A, F, idle_limit_s=IDLE_LIMIT_S)
    threading.Thread(target=lambda: stop.wait(120) and conn.close(), daemon=True).start()
    served: list[tuple[int, ...]] = []
    stats: dict[str, Any] = {}
    try:
        while (step := conn.ffn.next_step()) is not None:
            serve_step(conn, step)
            served.append(step.attention_ranks)
            stats = conn.ffn.stats()
    except AFDPeerError:
        if not stop.is_set():  # the other FFN rank closing at the end is no failure
            raise
    finally:
        conn.close()
    return {"served": served, **stats}


def one_step(conn: Any, rank: int, step: int, n: int) -> None:
    """One step of ``n`` tokens, every layer's combined result checked exactly."""
    conn.attention.begin_step(ControlPayload(step, rank, (AFDDPMetadata(rank, (n,)),)))
    for layer in LAYERS:
        x, ids, weights = routing(rank, step, layer, n, narrow=False)
        conn.attention.send(layer, 0, x, routing=ExpertRouting(ids, weights))
        result = conn.attention.recv(layer, 0)
        assert torch.equal(result, expert_function(x, ids, weights, layer)), (rank, step, layer)


def steady_attention(port: int, done: Any, stopped: Any) -> int:
    """Attention rank 0: a checked step every 20 ms until ``done`` and five more; then
    close and set ``stopped``. Returns the steps run."""
    conn = connect("attention", 0, port, A, F, idle_limit_s=IDLE_LIMIT_S)
    steps = after_done = 0
    try:
        while after_done < 5:
            one_step(conn, 0, steps, 1 + steps % 3)
            steps += 1
            after_done += done.is_set()
            time.sleep(0.02)
    finally:
        conn.close()
        stopped.set()
    return steps


def leaving_attention(port: int, how: str, gone: Any) -> int:
    """Attention rank 1: three steps, then ``close`` its connector, or be killed in the
    middle of a fourth step with its first layer sent to both FFN ranks."""
    conn = connect("attention", 1, port, A, F, idle_limit_s=IDLE_LIMIT_S)
    for step in range(3):
        one_step(conn, 1, step, 2)
    if how == "close":
        conn.close()
        gone.set()
        return 3
    conn.attention.begin_step(ControlPayload(3, 1, (AFDDPMetadata(1, (4,)),)))
    x, ids, weights = routing(1, 3, LAYERS[0], 4, narrow=False)
    conn.attention.send(LAYERS[0], 0, x, routing=ExpertRouting(ids, weights))
    gone.set()
    os.kill(os.getpid(), signal.SIGKILL)
    return -1  # not reached


def replacing_attention(port: int, gone: Any, done: Any) -> float:
    """A new server for attention rank 1 once its predecessor is ``gone``: five checked
    steps (step ids start afresh), then close and set ``done``. Returns the seconds its
    rendezvous and links took."""
    assert gone.wait(60)
    started = time.monotonic()
    conn = connect("attention", 1, port, A, F, idle_limit_s=IDLE_LIMIT_S)
    joined_s = time.monotonic() - started
    try:
        for step in range(5):
            one_step(conn, 1, 50 + step, 3)
    finally:
        conn.close()
        done.set()
    return joined_s


@pytest.mark.parametrize("how", ["close", "kill"])
def test_an_attention_rank_that_leaves_is_replaced_while_every_ffn_rank_serves_the_other(
    ranks, port, how
):
    ctx = ranks.context
    gone, done, stopped = ctx.Event(), ctx.Event(), ctx.Event()
    for f in range(F):
        ranks.start(f"ffn{f}", serve_until, port, f, stopped)
    ranks.start("attn0", steady_attention, port, done, stopped)
    ranks.start("attn1", leaving_attention, port, how, gone)
    ranks.start("attn1-new", replacing_attention, port, gone, done)
    out = ranks.join(90)
    for name in ("attn0", "attn1-new", "ffn0", "ffn1"):
        assert out[name].ok, out[name]
    if how == "kill":
        assert out["attn1"].exitcode == -signal.SIGKILL, out["attn1"]
    else:
        assert out["attn1"].ok, out["attn1"]
    leader, follower = out["ffn0"].value, out["ffn1"].value
    # Rank 0 stepped on, exactly (its every result is checked), until after rank 1's
    # successor ended (what it saw, not how many steps it managed: that is the host's).
    last_with_one = max(i for i, step in enumerate(leader["served"]) if 1 in step)
    assert any(0 in step for step in leader["served"][last_with_one + 1 :]), leader["served"]
    for ffn in (leader, follower):
        assert ffn["attention_replacements"] == 1, ffn
        with_one = sum(1 for ranks_of_step in ffn["served"] if 1 in ranks_of_step)
        assert with_one >= 3 + 5, ffn["served"]  # the first server's steps and the new one's
    # The follower ran exactly the steps the leader formed (it may lag by the last one).
    assert follower["served"] == leader["served"][: len(follower["served"])]
    assert len(leader["served"]) - len(follower["served"]) <= 1
    print(f"replacement ({how}) joined in {out['attn1-new'].value:.2f} s")
    assert out["attn1-new"].value < VACANCY_WAIT_S + 5.0


def idle_ffn(port: int, rank: int) -> None:
    conn = connect("ffn", rank, port, 1, F, idle_limit_s=2)
    try:
        while (step := conn.ffn.next_step()) is not None:
            serve_step(conn, step)
    finally:
        conn.close()


def short_attention(port: int) -> None:
    conn = connect("attention", 0, port, 1, F, idle_limit_s=2)
    one_step(conn, 0, 0, 2)
    conn.close()


def test_ffn_ranks_left_without_attention_ranks_fail_after_the_idle_limit(ranks, port):
    for f in range(F):
        ranks.start(f"ffn{f}", idle_ffn, port, f)
    ranks.start("attn0", short_attention, port)
    out = ranks.join(40)
    assert out["attn0"].ok, out["attn0"]
    leader, follower = out["ffn0"], out["ffn1"]
    assert leader.error_type == "AFDPeerError", leader
    assert "no attention rank came within ffn_idle_limit_s=2 s" in leader.error, leader.error
    # The follower learns from the FFN ranks' group that FFN rank 0 is gone.
    assert follower.error_type == "AFDPeerError", follower
    assert "FFN rank 0 (world rank 0)" in follower.error, follower.error
    assert max(leader.elapsed_s, follower.elapsed_s) < 15, (leader, follower)
