"""An attention rank of P2pGlooAFDConnector leaves and a new server takes its seat.

Real processes over real gloo (2A1F and 1A1F), ``ffn_idle_limit_s`` > 0: the FFN rank
lets the link of the rank that left go, keeps serving the other attention rank exactly,
and opens a link with the server that replaces it. A second server for a rank that is
serving, or one whose model differs, fails alone; an FFN rank left without attention
ranks fails after its idle limit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
import torch

from afd_core.runtime.seats import VACANCY_WAIT_S
from tests.integration.test_gloo_connector import (
    WIRE,
    attention_inputs,
    connect,
    ffn_function,
    payload,
)

IDLE_LIMIT_S = 60
FIRST_STEP = 100


def serve_until(port: int, a: int, stop: Any) -> dict[str, Any]:
    """FFN rank 0 of ``a`` attention ranks: serve steps until ``stop`` is set; its
    endpoint's stats and the attention ranks of every step served."""
    conn = connect("ffn", 0, port, a, 1, idle_limit_s=IDLE_LIMIT_S)
    threading.Thread(target=lambda: stop.wait(120) and conn.close(), daemon=True).start()
    served: list[tuple[int, ...]] = []
    stats: dict[str, Any] = {}
    try:
        while (step := conn.ffn.next_step()) is not None:
            for layer in range(WIRE.num_exchange_layers):
                batch = conn.ffn.recv(step, layer, 0)
                conn.ffn.send(batch, ffn_function(batch.hidden, layer, None))
            served.append(step.attention_ranks)
            stats = conn.ffn.stats()
    finally:
        conn.close()
    return {"served": served, **stats}


def one_step(conn: Any, rank: int, step: int, n: int) -> None:
    """One checked step of ``n`` tokens."""
    conn.attention.begin_step(payload(rank, step, (n,)))
    for layer in range(WIRE.num_exchange_layers):
        hidden, _ = attention_inputs(rank, step, layer, 0, n, WIRE)
        conn.attention.send(layer, 0, hidden)
        out = conn.attention.recv(layer, 0)
        assert torch.equal(out, ffn_function(hidden, layer, None)), (rank, step, layer)


def steady_attention(port: int, a: int, done: Any, stopped: Any) -> int:
    """Attention rank 0: checked steps, one every 20 ms, until ``done`` and five more;
    then close and set ``stopped``. Returns the steps run."""
    conn = connect("attention", 0, port, a, 1, idle_limit_s=IDLE_LIMIT_S)
    steps = after_done = 0
    try:
        while after_done < 5:
            one_step(conn, 0, FIRST_STEP + steps, 1 + steps % 3)
            steps += 1
            after_done += done.is_set()
            time.sleep(0.02)
    finally:
        conn.close()
        stopped.set()
    return steps


def leaving_attention(port: int, how: str, gone: Any) -> int:
    """Attention rank 1: three steps, then leave: ``close`` its connector, or be killed
    (SIGKILL) in the middle of a fourth step, with layer 0 sent."""
    conn = connect("attention", 1, port, 2, 1, idle_limit_s=IDLE_LIMIT_S)
    for i in range(3):
        one_step(conn, 1, FIRST_STEP + i, 2)
    if how == "close":
        conn.close()
        gone.set()
        return 3
    conn.attention.begin_step(payload(1, FIRST_STEP + 3, (2,)))
    conn.attention.send(0, 0, attention_inputs(1, FIRST_STEP + 3, 0, 0, 2, WIRE)[0])
    gone.set()
    os.kill(os.getpid(), signal.SIGKILL)
    return -1  # not reached


def replacing_attention(port: int, rank: int, a: int, gone: Any, done: Any) -> float:
    """A new server for attention rank ``rank`` once its predecessor is ``gone``: five
    checked steps (step ids start afresh), then close and set ``done``. Returns the
    seconds its rendezvous took."""
    assert gone.wait(60)
    started = time.monotonic()
    conn = connect("attention", rank, port, a, 1, idle_limit_s=IDLE_LIMIT_S)
    joined_s = time.monotonic() - started
    try:
        for i in range(5):
            one_step(conn, rank, FIRST_STEP + i, 3)
    finally:
        conn.close()
        done.set()
    return joined_s


@pytest.mark.parametrize("how", ["close", "kill"])
def test_an_attention_rank_that_leaves_is_replaced_while_its_ffn_rank_serves_the_other(
    ranks, port, how
):
    ctx = ranks.context
    gone, done, stopped = ctx.Event(), ctx.Event(), ctx.Event()
    ranks.start("ffn", serve_until, port, 2, stopped)
    ranks.start("attn0", steady_attention, port, 2, done, stopped)
    ranks.start("attn1", leaving_attention, port, how, gone)
    ranks.start("attn1-new", replacing_attention, port, 1, 2, gone, done)
    out = ranks.join(90)
    assert out["attn0"].ok, out["attn0"]
    assert out["attn1-new"].ok, out["attn1-new"]
    assert out["ffn"].ok, out["ffn"]
    if how == "kill":
        assert out["attn1"].exitcode == -signal.SIGKILL, out["attn1"]
    else:
        assert out["attn1"].ok, out["attn1"]
    ffn = out["ffn"].value
    assert ffn["attention_replacements"] == 1, ffn
    # Rank 0 stepped on, exactly (its every result is checked), until after rank 1's
    # successor ended (what it saw, not how many steps it managed: that is the host's).
    last_with_one = max(i for i, step in enumerate(ffn["served"]) if 1 in step)
    assert any(0 in step for step in ffn["served"][last_with_one + 1 :]), ffn["served"]
    with_one = sum(1 for ranks_of_step in ffn["served"] if 1 in ranks_of_step)
    assert with_one >= 3 + 5, ffn["served"]  # the first server's steps and the new one's
    print(f"replacement ({how}) joined in {out['attn1-new'].value:.2f} s")
    assert out["attn1-new"].value < VACANCY_WAIT_S + 5.0


def second_server(port: int, delay_s: float, finished: Any) -> None:
    """Another server for attention rank 0 (of a 1A1F world), ``delay_s`` after the first;
    sets ``finished`` when its attempt is over."""
    time.sleep(delay_s)
    try:
        conn = connect("attention", 0, port, 1, 1, idle_limit_s=IDLE_LIMIT_S)
        conn.close()
    finally:
        finished.set()


def test_a_second_server_for_a_serving_attention_rank_fails_alone_naming_the_rank(ranks, port):
    finished, stopped = ranks.context.Event(), ranks.context.Event()
    ranks.start("ffn", serve_until, port, 1, stopped)
    ranks.start("attn0", steady_attention, port, 1, finished, stopped)
    ranks.start("attn0-again", second_server, port, 2.0, finished)
    out = ranks.join(60)
    again = out["attn0-again"]
    assert again.error_type == "AFDProtocolError", again
    assert "attention rank 0 joined twice: it is serving already" in again.error, again.error
    assert again.elapsed_s < 2.0 + VACANCY_WAIT_S + 5.0, again.elapsed_s
    assert out["attn0"].ok and out["attn0"].value > 10, out["attn0"]
    assert out["ffn"].ok and out["ffn"].value["attention_replacements"] == 0, out["ffn"]


def mismatched_replacement(port: int, gone: Any, refused: Any) -> None:
    """A replacement for attention rank 0 whose model has another hidden size; sets
    ``refused`` when its attempt is over."""
    assert gone.wait(60)
    wire = replace(WIRE, hidden_size=WIRE.hidden_size * 2)
    try:
        conn = connect("attention", 0, port, 1, 1, wire=wire, idle_limit_s=IDLE_LIMIT_S)
        conn.close()
    finally:
        refused.set()


def short_attention(port: int, gone: Any) -> None:
    conn = connect("attention", 0, port, 1, 1, idle_limit_s=IDLE_LIMIT_S)
    one_step(conn, 0, FIRST_STEP, 2)
    conn.close()
    gone.set()


def test_a_replacement_whose_model_differs_fails_alone_and_the_seat_stays_open(ranks, port):
    ctx = ranks.context
    gone, refused, done, stopped = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    ranks.start("ffn", serve_until, port, 1, stopped)
    ranks.start("attn0", short_attention, port, gone)
    ranks.start("attn0-bad", mismatched_replacement, port, gone, refused)
    ranks.start("attn0-good", replacing_attention_after, port, refused, done, stopped)
    out = ranks.join(60)
    bad = out["attn0-bad"]
    assert bad.error_type == "AFDProtocolError", bad
    assert f"wire.hidden_size={WIRE.hidden_size * 2}" in bad.error, bad.error
    assert out["attn0-good"].ok, out["attn0-good"]
    assert out["ffn"].ok and out["ffn"].value["attention_replacements"] == 1, out["ffn"]


def replacing_attention_after(port: int, refused: Any, done: Any, stopped: Any) -> float:
    """The good replacement, once the bad one was refused; sets ``stopped`` at the end."""
    try:
        return replacing_attention(port, 0, 1, refused, done)
    finally:
        stopped.set()


def idle_ffn(port: int) -> None:
    conn = connect("ffn", 0, port, 1, 1, idle_limit_s=2)
    try:
        while (step := conn.ffn.next_step()) is not None:
            for layer in range(WIRE.num_exchange_layers):
                batch = conn.ffn.recv(step, layer, 0)
                conn.ffn.send(batch, ffn_function(batch.hidden, layer, None))
    finally:
        conn.close()


def test_an_ffn_rank_left_without_attention_ranks_fails_after_its_idle_limit(ranks, port):
    gone = ranks.context.Event()
    ranks.start("ffn", idle_ffn, port)
    ranks.start("attn0", short_attention, port, gone)
    out = ranks.join(40)
    assert out["attn0"].ok, out["attn0"]
    ffn = out["ffn"]
    assert ffn.error_type == "AFDPeerError", ffn
    assert "no attention rank came within ffn_idle_limit_s=2 s" in ffn.error, ffn.error
    assert ffn.elapsed_s < 15, ffn.elapsed_s
