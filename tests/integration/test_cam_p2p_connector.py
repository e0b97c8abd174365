"""CAMP2pAFDConnector between real processes over real gloo (the CPU reference ops).

The rank programs are those of the gloo connector's tests, given this connector's name:
the FFN ranks apply a known function (``hidden * 2 + layer``), the attention ranks check
every result exactly. Every test runs its ranks with a hard timeout and kills them at
the end.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch

from afd_core.topology import Topology
from afd_core.wire.metadata import ControlPayload
from tests.integration.peer_errors import reports_peer_gone
from tests.integration.test_gloo_connector import (
    LAYERS,
    TOPOLOGIES,
    WIRE,
    Sync,
    attention_closed_while_waiting,
    connect,
    exchange_steps,
    ffn_dying_at_layer_1,
    payload,
    run_attention,
    run_ffn,
    silent_ffn,
)

CAM = "CAMP2pAFDConnector"

#: The gloo connector's one-stage topologies, and a two-stage one (the stages of a step
#: run on op groups of their own).
CAM_TOPOLOGIES = {
    **TOPOLOGIES,
    "2A1F two stages": (2, 1, {0: [(3, 2), (1, 4)], 1: [(2, 5), (0, 3)]}),
}


@pytest.mark.parametrize("name", sorted(CAM_TOPOLOGIES))
def test_round_trips_are_exact_and_blocks_are_served_as_one_batch(ranks, port, name):
    a, f, counts = CAM_TOPOLOGIES[name]
    topo = Topology(a, f)
    syncs = [Sync(ranks.context) for _ in range(f)]
    for r in range(f):
        payloads = sum(len(counts[m]) for m in topo.block_of(r))
        ranks.start(f"ffn{r}", run_ffn, port, a, f, r, payloads, WIRE, syncs[r], CAM)
    for r in range(a):
        ranks.start(f"attn{r}", run_attention, port, a, f, r, counts[r], WIRE, syncs, 20, CAM)
    out = ranks.join(45)
    assert all(o.ok for o in out.values()), out
    for r in range(a):
        assert out[f"attn{r}"].value == sum(n for c in counts[r] for n in c) * LAYERS
    for r in range(f):
        steps, _ = out[f"ffn{r}"].value
        # Every first payload of the block was queued before the FFN looked: one batch.
        assert steps[0] == tuple(topo.block_of(r)), steps
    assert not out["ffn0"].value[1], "FFN rank 0 still serves the rendezvous store after close"


# Steps of part of a block ----------------------------------------------------------------


def attention_taking_turns(
    port: int, rank: int, counts: list[tuple[int, ...]], turns: list[Any], sync: Sync
) -> int:
    """Attention rank of 2A1F: connect, wait for ``turns[rank]``, run its steps, hand the
    turn on, and close once the FFN rank is done; returns the rows checked."""
    conn = connect("attention", rank, port, 2, 1, connector=CAM)
    try:
        sync.first_sent.release()  # connected: the FFN rank may serve without this rank
        assert turns[rank].wait(20), f"attention rank {rank} never got its turn"
        checked = exchange_steps(conn, rank, counts)
        turns[rank + 1].set()
        assert sync.done.wait(20), "the FFN rank did not finish"
    finally:
        conn.close()
    return checked


def test_an_idle_attention_rank_of_the_block_takes_no_part_in_the_steps(ranks, port):
    counts = {0: [(3,), (0,), (5,)], 1: [(2,), (4,)]}
    turns = [ranks.context.Event() for _ in range(3)]
    sync = Sync(ranks.context)
    ranks.start("ffn", run_ffn, port, 2, 1, 0, 5, WIRE, sync, CAM)
    for rank, steps in counts.items():
        ranks.start(f"attn{rank}", attention_taking_turns, port, rank, steps, turns, sync)
    turns[0].set()
    out = ranks.join(45)
    assert all(o.ok for o in out.values()), out
    for rank, steps in counts.items():
        assert out[f"attn{rank}"].value == sum(n for c in steps for n in c) * LAYERS
    # Rank 1 was connected all along, yet the steps of rank 0 went on without it.
    steps, _ = out["ffn"].value
    assert steps == [(0,)] * 3 + [(1,)] * 2, steps


# Mispaired peers -------------------------------------------------------------------------


def miscounting_build(extra: int) -> None:
    """Make this process an attention rank whose build believes each stage of a step has
    ``extra`` more tokens than it announces (its endpoint sends them all)."""
    announced = ControlPayload.tokens_of

    def tokens_of(self: ControlPayload, attention_rank: int) -> tuple[int, ...]:
        return tuple(n + extra for n in announced(self, attention_rank))

    ControlPayload.tokens_of = tokens_of  # type: ignore[method-assign]


def ffn_serving_one_step(port: int) -> None:
    conn = connect("ffn", 0, port, 1, 1, connector=CAM)
    try:
        step = conn.ffn.next_step()
        conn.ffn.recv(step, 0, 0)
    finally:
        conn.close()


def attention_sending_more_rows_than_announced(port: int) -> None:
    miscounting_build(1)
    conn = connect("attention", 0, port, 1, 1, connector=CAM)
    try:
        conn.attention.begin_step(payload(0, 5, (2,)))
        conn.attention.send(0, 0, torch.ones(3, WIRE.hidden_size))
        conn.attention.recv(0, 0)
    finally:
        conn.close()


def test_rows_other_than_announced_are_a_protocol_error_naming_both_views(ranks, port):
    ranks.start("ffn", ffn_serving_one_step, port)
    ranks.start("attn", attention_sending_more_rows_than_announced, port)
    out = ranks.join(30)
    assert out["ffn"].error_type == "AFDProtocolError", out["ffn"]
    assert "rows: sent 3, expected 2" in out["ffn"].error, out["ffn"].error
    assert "attention rank 0 (world rank 1)" in out["ffn"].error
    assert "(while waiting for layer 0 of step 5)" in out["ffn"].error
    # The FFN rank closed, so the waiting attention rank learns it at once.
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    assert reports_peer_gone(out["attn"].error, "FFN rank 0 (world rank 0)", "layer 0 of step 5")


def test_config_mismatch_fails_fast_on_both_sides(ranks, port):
    # The FFN role thinks there are two attention ranks; the attention rank thinks one.
    ranks.start("ffn", connect, "ffn", 0, port, 2, 1, WIRE, 20, 0, CAM)
    ranks.start("attn", connect, "attention", 0, port, 1, 1, WIRE, 20, 0, CAM)
    out = ranks.join(15)
    for name in ("ffn", "attn"):
        assert out[name].error_type == "AFDProtocolError", out[name]
        assert "num_attention_ranks" in out[name].error
        assert out[name].elapsed_s < 10
    assert (
        "this ffn rank 0 has num_attention_ranks=2, attention rank 0 (world rank 1) has 1"
        in out["ffn"].error
    )


# Lost peers and close --------------------------------------------------------------------


def test_ffn_killed_mid_step_gives_peer_error_naming_layer_and_step(ranks, port):
    ranks.start("ffn", ffn_dying_at_layer_1, port, CAM)
    ranks.start("attn", run_attention, port, 1, 1, 0, [(2,)], WIRE, None, 20, CAM)
    out = ranks.join(30)
    assert out["ffn"].exitcode == -signal.SIGKILL
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    assert reports_peer_gone(
        out["attn"].error, "FFN rank 0 (world rank 0)", "layer 1 of step 100"
    ), out["attn"].error
    assert out["attn"].elapsed_s < 10


def test_close_wakes_recv_and_the_ffn_learns_the_attention_rank_left(ranks, port):
    release = ranks.context.Event()
    ranks.start("ffn", silent_ffn, port, release, CAM)
    ranks.start("attn", attention_closed_while_waiting, port, release, CAM)
    out = ranks.join(30)
    assert out["attn"].ok, out["attn"]
    error_type, woke_after = out["attn"].value
    assert error_type == "AFDShutdown"
    assert woke_after < 5.0  # milliseconds in practice; the wait's own bound is 20 s
    # The control channel's receive fails, or the peer watch saw the goodbye: either
    # names the rank.
    assert out["ffn"].value.startswith(
        (
            "AFDPeerError: AFD: attention rank 0 (world rank 1) closed the connection",
            "AFDPeerError: AFD: attention rank 0 (world rank 1) left: it closed its connector",
        )
    ), out["ffn"].value
