"""P2pGlooAFDConnector between real processes over real gloo.

The FFN ranks apply a known function (``hidden * 2 + layer``, plus the row sum of the
router logits when the gate runs on attention); the attention ranks check every result
exactly. Every test runs its ranks with a hard timeout and kills them at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import pytest
import torch

from afd_core.assembly import P2P_BLOCK, Control, Layout, P2pBlock, Recipe, gloo_data_plane
from afd_core.config import AFDConfig
from afd_core.connector import Connector, WireSpec
from afd_core.connectors.gloo import P2pGlooAFDConnector
from afd_core.plugins.registry import get_registry
from afd_core.runtime.liveness import SILENCE_S
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from tests.integration.peer_errors import reports_peer_gone, skip_the_exchange_rule
from tests.unit.core.loopback import RecordingReplayGuard

LAYERS = 3
WIRE = WireSpec(hidden_size=16, dtype="float32", num_exchange_layers=LAYERS)
GATE_WIRE = WireSpec(
    hidden_size=32, dtype="bfloat16", num_exchange_layers=LAYERS, router_logits_width=8
)


def config(
    role: str,
    port: int,
    a: int,
    f: int,
    timeout_s: int = 20,
    gate: bool = False,
    idle_limit_s: int = 0,
    connector: str = "P2pGlooAFDConnector",
) -> AFDConfig:
    """``idle_limit_s`` 0 (these tests' default): an attention rank that leaves fails its
    FFN rank; above 0 the FFN rank lets its link go and accepts a replacement."""
    return AFDConfig(
        role=role,
        connector=connector,
        port=port,
        num_attention_ranks=a,
        num_ffn_ranks=f,
        afd_process_group_timeout_s=timeout_s,
        compute_gate_on_attention=gate,
        ffn_idle_limit_s=idle_limit_s,
    )


def connect(
    role: str,
    rank: int,
    port: int,
    a: int,
    f: int,
    wire: WireSpec = WIRE,
    timeout_s: int = 20,
    idle_limit_s: int = 0,
    connector: str = "P2pGlooAFDConnector",
) -> Connector:
    """An initialised connector of the installed class named ``connector``."""
    gate = bool(wire.router_logits_width)
    cfg = config(role, port, a, f, timeout_s, gate, idle_limit_s, connector)
    conn = get_registry().connector(connector).load()(cfg, rank, wire)
    conn.initialize()
    return conn


def ffn_function(hidden: torch.Tensor, layer: int, logits: torch.Tensor | None) -> torch.Tensor:
    out = hidden * 2 + layer
    if logits is not None:
        out = out + logits.float().sum(-1, keepdim=True).to(out.dtype)
    return out


def payload(rank: int, step: int, counts: tuple[int, ...]) -> ControlPayload:
    return ControlPayload(step, rank, tuple(AFDDPMetadata(rank, (n,)) for n in counts))


def attention_inputs(
    rank: int, step: int, layer: int, stage: int, n: int, wire: WireSpec
) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(hash((rank, step, layer, stage)) % 2**31)
    hidden = torch.randint(-50, 50, (n, wire.hidden_size), generator=gen).to(
        getattr(torch, wire.dtype)
    )
    logits = None
    if wire.router_logits_width:
        logits = torch.randint(-4, 4, (n, wire.router_logits_width), generator=gen).float()
    return hidden, logits


# Rank programs (run in child processes) ----------------------------------------------


def store_listening(port: int) -> bool:
    """Whether something still accepts connections at ``port`` after one second."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                time.sleep(0.05)
        except OSError:
            return False
    return True


class Sync:
    """Cross-process signals of one FFN rank: its block's first payloads sent; done."""

    def __init__(self, ctx: Any) -> None:
        self.first_sent = ctx.Semaphore(0)
        self.done = ctx.Event()


def run_ffn(
    port: int,
    a: int,
    f: int,
    rank: int,
    payloads: int,
    wire: WireSpec = WIRE,
    sync: Sync | None = None,
    connector: str = "P2pGlooAFDConnector",
) -> tuple[list[tuple[int, ...]], bool]:
    """Serve ``payloads`` control payloads.

    Returns the attention ranks of each step, and whether the rendezvous store still
    accepts connections once the connector is closed.
    """
    conn = connect("ffn", rank, port, a, f, wire, connector=connector)
    if sync is not None:  # let every rank of the block queue its first payload
        for _ in conn.topology.block_of(rank):
            assert sync.first_sent.acquire(timeout=20)
        time.sleep(0.2)
    steps = []
    try:
        while payloads > 0:
            step = conn.ffn.next_step()
            assert step is not None
            for layer in range(wire.num_exchange_layers):
                for stage in range(step.num_stages):
                    batch = conn.ffn.recv(step, layer, stage)
                    assert batch.hidden.shape[0] == sum(batch.splits)
                    conn.ffn.send(batch, ffn_function(batch.hidden, layer, batch.router_logits))
            steps.append(step.attention_ranks)
            payloads -= len(step.attention_ranks)
    finally:
        if sync is not None:
            sync.done.set()
        conn.close()
    return steps, store_listening(port)


def run_attention(
    port: int,
    a: int,
    f: int,
    rank: int,
    counts: list[tuple[int, ...]],
    wire: WireSpec = WIRE,
    syncs: list[Sync] | None = None,
    timeout_s: int = 20,
    connector: str = "P2pGlooAFDConnector",
) -> int:
    """Run one step per entry of ``counts`` (token counts per stage); check every result.

    With ``syncs`` (one per FFN rank), closes only once every FFN rank is done: an FFN
    rank stops serving when an attention rank of its block leaves.
    """
    conn = connect("attention", rank, port, a, f, wire, timeout_s, connector=connector)
    try:
        first_sent = None if syncs is None else syncs[conn.topology.ffn_rank_of(rank)].first_sent
        checked = exchange_steps(conn, rank, counts, wire, first_sent)
        for sync in syncs or ():
            assert sync.done.wait(20), "an FFN rank did not finish"
    finally:
        conn.close()
    return checked


def exchange_steps(
    conn: Connector,
    rank: int,
    counts: list[tuple[int, ...]],
    wire: WireSpec = WIRE,
    first_sent: Any = None,
) -> int:
    """Attention rank ``rank`` of ``conn`` runs steps 100, 101, ...: one per entry of
    ``counts`` (token counts per stage), every result checked; returns the rows checked.

    ``first_sent`` (a semaphore) is released once the first step was announced.
    """
    checked = 0
    for i, stage_counts in enumerate(counts):
        step = 100 + i
        conn.attention.begin_step(payload(rank, step, stage_counts))
        if first_sent is not None and i == 0:
            first_sent.release()
        for layer in range(wire.num_exchange_layers):
            for stage, n in enumerate(stage_counts):
                hidden, logits = attention_inputs(rank, step, layer, stage, n, wire)
                conn.attention.send(layer, stage, hidden, router_logits=logits)
                out = conn.attention.recv(layer, stage)
                expected = ffn_function(hidden, layer, logits)
                assert torch.equal(out, expected), (rank, step, layer, stage)
                checked += n
    return checked


# Tests ---------------------------------------------------------------------------------

TOPOLOGIES = {
    "1A1F": (1, 1, {0: [(3,), (1,), (7,), (2,)]}),
    "2A1F": (2, 1, {0: [(4,), (1,), (2,), (1,)], 1: [(2,), (5,), (1,), (1,)]}),
    "3A2F": (
        3,
        2,
        {0: [(3,), (0,), (2,), (1,)], 1: [(0,), (4,), (1,), (6,)], 2: [(5,), (1,), (0,), (2,)]},
    ),
}


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_round_trips_are_exact_and_blocks_are_served_as_one_batch(ranks, port, name):
    a, f, counts = TOPOLOGIES[name]
    from afd_core.topology import Topology

    topo = Topology(a, f)
    syncs = [Sync(ranks.context) for _ in range(f)]
    for r in range(f):
        ranks.start(f"ffn{r}", run_ffn, port, a, f, r, len(topo.block_of(r)) * 4, WIRE, syncs[r])
    for r in range(a):
        ranks.start(f"attn{r}", run_attention, port, a, f, r, counts[r], WIRE, syncs)
    out = ranks.join(45)
    assert all(o.ok for o in out.values()), out
    for r in range(a):
        assert out[f"attn{r}"].value == sum(n for c in counts[r] for n in c) * LAYERS
    for r in range(f):
        steps, _ = out[f"ffn{r}"].value
        # Every first payload of the block was queued before the FFN looked: one batch.
        assert steps[0] == tuple(topo.block_of(r)), steps
    assert not out["ffn0"].value[1], "FFN rank 0 still serves the rendezvous store after close"


def test_gate_on_attention_sends_router_logits_over_two_stages(ranks, port):
    counts = [(3, 2), (1, 4), (2, 1)]
    ranks.start("ffn", run_ffn, port, 1, 1, 0, len(counts), GATE_WIRE)
    ranks.start("attn", run_attention, port, 1, 1, 0, counts, GATE_WIRE)
    out = ranks.join(30)
    assert all(o.ok for o in out.values()), out
    assert out["attn"].value == sum(map(sum, counts)) * LAYERS


def test_attention_may_start_before_ffn(ranks, port):
    ranks.start("attn", run_attention, port, 1, 1, 0, [(2,), (3,)])
    ranks.start("ffn", run_ffn, port, 1, 1, 0, 2, WIRE, delay_s=1.0)
    out = ranks.join(30)
    assert all(o.ok for o in out.values()), out


def test_config_mismatch_fails_fast_on_both_sides(ranks, port):
    # The FFN role thinks there are two attention ranks; the attention rank thinks one.
    ranks.start("ffn", connect, "ffn", 0, port, 2, 1)
    ranks.start("attn", connect, "attention", 0, port, 1, 1)
    out = ranks.join(15)
    for name in ("ffn", "attn"):
        assert out[name].error_type == "AFDProtocolError", out[name]
        assert "num_attention_ranks" in out[name].error
        assert out[name].elapsed_s < 10
    assert (
        "this ffn rank 0 has num_attention_ranks=2, attention rank 0 (world rank 1) has 1"
        in out["ffn"].error
    )


def test_missing_rank_is_reported_after_the_timeout(ranks, port):
    # 2A1F with attention rank 1 never started; 2 s rendezvous timeout.
    ranks.start("ffn", connect, "ffn", 0, port, 2, 1, WIRE, 2)
    ranks.start("attn0", connect, "attention", 0, port, 2, 1, WIRE, 2)
    out = ranks.join(20)
    assert out["ffn"].error_type == "AFDPeerError", out["ffn"]
    assert (
        "AFD rendezvous: attention rank 1 (world rank 2) did not arrive within 2 s at "
        f"127.0.0.1:{port}; start it" in out["ffn"].error
    )
    # Attention rank 0 gives up at its own deadline, or when the FFN rank stops the store.
    assert out["attn0"].error_type == "AFDPeerError", out["attn0"]
    assert out["attn0"].elapsed_s < 5


def ffn_expecting_layer_0(port: int) -> None:
    conn = connect("ffn", 0, port, 1, 1)
    try:
        step = conn.ffn.next_step()
        conn.ffn.recv(step, 0, 0)
    finally:
        conn.close()


def attention_sending_layer_1(port: int) -> None:
    skip_the_exchange_rule(WIRE.exchange_layers)  # else it refuses layer 1 first itself
    conn = connect("attention", 0, port, 1, 1)
    try:
        conn.attention.begin_step(payload(0, 5, (2,)))
        conn.attention.send(1, 0, torch.ones(2, WIRE.hidden_size))
        conn.attention.recv(1, 0)
    finally:
        conn.close()


def test_mispaired_layer_is_a_protocol_error_naming_both_views(ranks, port):
    ranks.start("ffn", ffn_expecting_layer_0, port)
    ranks.start("attn", attention_sending_layer_1, port)
    out = ranks.join(30)
    assert out["ffn"].error_type == "AFDProtocolError", out["ffn"]
    assert "layer: received 1, expected 0" in out["ffn"].error
    assert "attention rank 0 (world rank 1)" in out["ffn"].error
    # The FFN rank closed, so the waiting attention rank learns it at once.
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    assert reports_peer_gone(out["attn"].error, "FFN rank 0 (world rank 0)", "layer 1 of step 5")


def ffn_dying_at_layer_1(port: int, connector: str = "P2pGlooAFDConnector") -> None:
    conn = connect("ffn", 0, port, 1, 1, connector=connector)
    step = conn.ffn.next_step()
    batch = conn.ffn.recv(step, 0, 0)
    conn.ffn.send(batch, ffn_function(batch.hidden, 0, None))
    conn.ffn.recv(step, 1, 0)
    os.kill(os.getpid(), signal.SIGKILL)


def test_ffn_killed_mid_step_gives_peer_error_without_hanging(ranks, port):
    ranks.start("ffn", ffn_dying_at_layer_1, port)
    ranks.start("attn", run_attention, port, 1, 1, 0, [(2,)])
    out = ranks.join(30)
    assert out["ffn"].exitcode == -signal.SIGKILL
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    assert reports_peer_gone(
        out["attn"].error, "FFN rank 0 (world rank 0)", "layer 1 of step 100"
    ), out["attn"].error
    assert out["attn"].elapsed_s < 10


def ffn_closed_by_another_thread(port: int) -> float:
    conn = connect("ffn", 0, port, 1, 1)
    closed_at = []

    def close_later() -> None:
        time.sleep(0.5)
        closed_at.append(time.monotonic())
        conn.close()

    threading.Thread(target=close_later).start()
    assert conn.ffn.next_step() is None
    return time.monotonic() - closed_at[0]


def idle_attention(port: int) -> None:
    conn = connect("attention", 0, port, 1, 1)
    time.sleep(2)
    conn.close()


def test_close_from_another_thread_wakes_recv_step(ranks, port):
    ranks.start("ffn", ffn_closed_by_another_thread, port)
    ranks.start("attn", idle_attention, port)
    out = ranks.join(30)
    assert out["ffn"].ok, out["ffn"]
    # Woken within milliseconds; without the wake-up it would wait for the peer (20 s).
    assert out["ffn"].value < 5.0


def silent_ffn(port: int, release: Any, connector: str = "P2pGlooAFDConnector") -> str:
    """Takes one layer from the attention rank, never answers, then sees it leave."""
    conn = connect("ffn", 0, port, 1, 1, connector=connector)
    try:
        step = conn.ffn.next_step()
        conn.ffn.recv(step, 0, 0)
        assert release.wait(20)
        try:
            conn.ffn.next_step()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"
    finally:
        conn.close()


def attention_closed_while_waiting(
    port: int, release: Any, connector: str = "P2pGlooAFDConnector"
) -> tuple[str, float]:
    conn = connect("attention", 0, port, 1, 1, connector=connector)
    closed_at = []

    def close_later() -> None:
        time.sleep(0.5)
        closed_at.append(time.monotonic())
        conn.close()

    conn.attention.begin_step(payload(0, 0, (2,)))
    conn.attention.send(0, 0, torch.zeros(2, WIRE.hidden_size))
    threading.Thread(target=close_later).start()
    try:
        conn.attention.recv(0, 0)
    except Exception as exc:
        release.set()
        return type(exc).__name__, time.monotonic() - closed_at[0]
    return "no error", 0.0


def test_close_wakes_recv_and_the_ffn_learns_the_attention_rank_left(ranks, port):
    release = ranks.context.Event()
    ranks.start("ffn", silent_ffn, port, release)
    ranks.start("attn", attention_closed_while_waiting, port, release)
    out = ranks.join(30)
    assert out["attn"].ok, out["attn"]
    error_type, woke_after = out["attn"].value
    assert error_type == "AFDShutdown"
    assert woke_after < 5.0  # milliseconds in practice; the wait's own bound is 20 s
    # The inbox's receive fails, or the peer watch saw the goodbye: either names the rank.
    assert out["ffn"].value.startswith(
        (
            "AFDPeerError: AFD: attention rank 0 (world rank 1) closed the connection",
            "AFDPeerError: AFD: attention rank 0 (world rank 1) left: it closed its connector",
        )
    ), out["ffn"].value


def stalled_ffn(port: int) -> None:
    conn = connect("ffn", 0, port, 1, 1)
    try:
        step = conn.ffn.next_step()
        conn.ffn.recv(step, 0, 0)
        time.sleep(5)
    finally:
        conn.close()


def test_a_stalled_peer_is_reported_after_the_timeout(ranks, port):
    ranks.start("ffn", stalled_ffn, port)
    ranks.start("attn", run_attention, port, 1, 1, 0, [(2,)], WIRE, None, 2)
    out = ranks.join(30)
    assert out["attn"].error_type == "AFDPeerError", out["attn"]
    assert (
        "FFN rank 0 (world rank 0) did not answer within 2 s (layer 0 of step 100)"
        in out["attn"].error
    )
    assert out["attn"].elapsed_s < 6


def close_during_initialize(role: str, port: int) -> tuple[str, float, bool]:
    """Start initialize() with no peer, close from another thread; report what happened."""
    conn = P2pGlooAFDConnector(config(role, port, 1, 1), 0, WIRE)
    outcome: list[str] = []

    def initialize() -> None:
        try:
            conn.initialize()
            outcome.append("no error")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=initialize)
    thread.start()
    time.sleep(0.5)
    closed_at = time.monotonic()
    conn.close()
    thread.join(10)
    took = time.monotonic() - closed_at
    with socket.socket() as sock:  # FFN rank 0 no longer holds the store's port
        try:
            sock.bind(("127.0.0.1", port))
            port_free = True
        except OSError:
            port_free = False
    return outcome[0] if outcome else "still waiting", took, port_free


@pytest.mark.parametrize("role", ["ffn", "attention"])
def test_close_during_initialize_stops_the_rendezvous(ranks, port, role):
    ranks.start(role, close_during_initialize, role, port)
    out = ranks.join(20)
    assert out[role].ok, out[role]
    error_type, took, port_free = out[role].value
    assert error_type == "AFDShutdown"
    assert took < 5.0  # half a second in practice; the rendezvous's own bound is 20 s
    assert port_free


# Graph steps (header-less messages) over real gloo ---------------------------------------
# Nothing is captured on CPU: the attention ranks run their calls of a capture step eagerly,
# which moves the data a replay of the captured graph would move. The gloo connector has
# no graph steps; this one is composed of the same public parts plus a replay guard that
# only records (nothing runs on a device).


class GlooWithGraphSteps(Connector):
    """afd-core's P2P parts over gloo, with a recording replay guard."""

    name = "P2pGlooAFDConnector"
    pattern_type = P2pBlock

    def recipe(self) -> Recipe:
        guard = RecordingReplayGuard()
        return Recipe(
            Layout.WORLD, Control.ANNOUNCED, gloo_data_plane(), P2P_BLOCK, lambda site: guard
        )


def connect_graph(role: str, rank: int, port: int) -> GlooWithGraphSteps:
    conn = GlooWithGraphSteps(config(role, port, 2, 1, gate=True), rank, GATE_WIRE)
    conn.initialize()
    return conn


def graph_ffn(port: int, payloads: int, done: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """FFN rank of two attention ranks: serve graph steps into caller-owned buffers until
    ``payloads`` payloads were served, then set ``done``; return (ranks, token counts) of
    every step."""
    conn = connect_graph("ffn", 0, port)
    served: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    try:
        while sum(len(ranks) for ranks, _ in served) < payloads:
            step = conn.ffn.next_step()
            assert step.is_graph_step
            rows = sum(step.stage_tokens(0))
            hidden = torch.empty(rows, GATE_WIRE.hidden_size, dtype=torch.bfloat16)
            logits = torch.empty(rows, GATE_WIRE.router_logits_width)
            for layer in range(LAYERS):
                conn.ffn.recv_into(step, layer, 0, hidden, logits)
                conn.ffn.send_from(step, layer, 0, ffn_function(hidden, layer, logits))
            served.append((step.attention_ranks, step.stage_tokens(0)))
    finally:
        done.set()
        conn.close()
    return served


def graph_attention(port: int, rank: int, counts: list[int], done: Any) -> int:
    """Attention rank: capture-step payloads, header-less exchanges, exact results. It
    closes once the FFN rank is ``done``: this world has one group, so an attention rank
    that leaves fails the FFN rank (at its next step boundary) while the other one may
    still have steps to send."""
    conn = connect_graph("attention", rank, port)
    exchanged = 0
    try:
        for step, n in enumerate(counts):
            conn.attention.begin_step(
                ControlPayload(
                    step,
                    rank,
                    (AFDDPMetadata(rank, (n,)),),
                    is_graph_capturing=True,
                    is_graph_step=True,
                )
            )
            for layer in range(LAYERS):
                hidden, logits = attention_inputs(rank, step, layer, 0, n, GATE_WIRE)
                conn.attention.send(layer, 0, hidden, router_logits=logits)
                out = conn.attention.recv(layer, 0)
                assert torch.equal(out, ffn_function(hidden, layer, logits)), (step, layer)
                exchanged += 1
        assert done.wait(30), "the FFN rank did not finish"
    finally:
        conn.close()
    return exchanged


def test_graph_steps_of_two_ranks_move_bare_tensors_exactly(ranks, port):
    counts = {0: [2, 5, 1], 1: [3, 1, 4]}
    done = ranks.context.Event()
    ranks.start("ffn", graph_ffn, port, 6, done)
    for rank, steps in counts.items():
        ranks.start(f"attn{rank}", graph_attention, port, rank, steps, done)
    out = ranks.join(45)
    assert all(o.ok for o in out.values()), out
    assert out["attn0"].value == out["attn1"].value == 3 * LAYERS
    # Steps hold whichever ranks were ready; each rank's payloads arrive in its order.
    for rank, steps in counts.items():
        seen = [
            n
            for ranks_, tokens in out["ffn"].value
            for r, n in zip(ranks_, tokens, strict=True)
            if r == rank
        ]
        assert seen == steps


# Peer liveness (afd_core.runtime.liveness) -------------------------------------------------------


def attention_after_one_layer(port: int) -> tuple[P2pGlooAFDConnector, list[float]]:
    """An attention rank that exchanged one layer with its FFN rank and now idles, and the
    times at which its connector reported a lost peer (filled by ``on_peer_lost``)."""
    conn = connect("attention", 0, port, 1, 1)
    lost: list[float] = []
    conn.on_peer_lost = lambda error: lost.append(time.monotonic())
    try:
        conn.attention.begin_step(payload(0, 0, (2,)))
        conn.attention.send(0, 0, torch.ones(2, WIRE.hidden_size))
        conn.attention.recv(0, 0)  # the FFN rank answers, then the attention rank idles
    except BaseException:
        conn.close()
        raise
    return conn, lost


def idle_attention_noticing_its_ffn(port: int, ffn_pid: Any, stop: str) -> tuple[str, str, float]:
    """Idle attention rank: the FFN process is stopped (``stop``); how soon it knows."""
    conn, lost = attention_after_one_layer(port)
    try:
        os.kill(ffn_pid.value, signal.SIGSTOP if stop == "freeze" else signal.SIGKILL)
        stopped = time.monotonic()
        deadline = stopped + 20
        while not lost and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            conn.attention.send(1, 0, torch.ones(2, WIRE.hidden_size))
        except Exception as exc:
            return type(exc).__name__, str(exc), (lost[0] if lost else deadline) - stopped
        return "no error", "", 0.0
    finally:
        if stop == "freeze":
            os.kill(ffn_pid.value, signal.SIGKILL)
        conn.close()


def ffn_serving_one_layer(port: int, ffn_pid: Any) -> None:
    ffn_pid.value = os.getpid()
    conn = connect("ffn", 0, port, 1, 1)
    step = conn.ffn.next_step()
    batch = conn.ffn.recv(step, 0, 0)
    conn.ffn.send(batch, batch.hidden)
    time.sleep(60)  # killed or frozen by the attention rank


@pytest.mark.parametrize(
    ("stop", "bound_s"),
    [("kill", 2.0), ("freeze", 5.0 + 3.0)],  # the socket closes at once; 5 s of silence
)
def test_an_idle_attention_rank_learns_within_seconds_that_its_ffn_rank_is_gone(
    ranks, port, stop, bound_s
):
    ffn_pid = ranks.context.Value("i", 0)
    ranks.start("ffn", ffn_serving_one_layer, port, ffn_pid)
    ranks.start("attn", idle_attention_noticing_its_ffn, port, ffn_pid, stop)
    out = ranks.join(40)
    error_type, message, took = out["attn"].value
    assert error_type == "AFDPeerError", out["attn"]
    assert message.startswith("AFD: FFN rank 0 (world rank 0) is gone: "), message
    what = "its process ended" if stop == "kill" else "sent no heartbeat for 5 s"
    assert what in message
    assert took < bound_s, took
    print(f"RESULT idle attention rank, FFN {stop}: lost after {took:.3f} s")


def ffn_busy_then_frozen(port: int, ffn_pid: Any, frozen: Any) -> None:
    """Serve one layer, announce a busy spell, and stay in it while the other rank
    freezes this process (as a profiler holding the GIL would starve its heartbeats)."""
    from afd_core.runtime import liveness

    ffn_pid.value = os.getpid()
    conn = connect("ffn", 0, port, 1, 1)
    step = conn.ffn.next_step()
    batch = conn.ffn.recv(step, 0, 0)
    conn.ffn.send(batch, batch.hidden)
    with liveness.busy():
        frozen.set()
        time.sleep(15)  # SIGSTOP, then SIGCONT, arrive here
    time.sleep(60)


def attention_tolerating_a_busy_ffn(port: int, ffn_pid: Any, frozen: Any) -> tuple[bool, float]:
    """Freeze the busy FFN process for longer than the silence bound, then thaw it."""
    conn, lost = attention_after_one_layer(port)
    try:
        assert frozen.wait(20)
        time.sleep(0.5)  # the busy announcement is read
        os.kill(ffn_pid.value, signal.SIGSTOP)
        time.sleep(SILENCE_S + 3.0)
        survived_freeze = not lost
        os.kill(ffn_pid.value, signal.SIGCONT)
        time.sleep(1.0)
        return survived_freeze and not lost, SILENCE_S + 3.0
    finally:
        os.kill(ffn_pid.value, signal.SIGKILL)
        conn.close()


def test_a_peer_in_an_announced_busy_spell_is_not_lost_for_its_silence(ranks, port):
    ffn_pid, frozen = ranks.context.Value("i", 0), ranks.context.Event()
    ranks.start("ffn", ffn_busy_then_frozen, port, ffn_pid, frozen)
    ranks.start("attn", attention_tolerating_a_busy_ffn, port, ffn_pid, frozen)
    out = ranks.join(60)
    survived, silent_s = out["attn"].value
    assert survived, f"the busy FFN rank was declared lost during {silent_s:g} s of silence"


# Start-up refusals ---------------------------------------------------------------------


def joining(role: str, rank: int, port: int) -> None:
    conn = connect(role, rank, port, 2, 1)
    conn.close()


def test_a_rank_that_joins_twice_is_named_by_every_rank_at_once(ranks, port):
    ranks.start("ffn", joining, "ffn", 0, port)
    ranks.start("attn0", joining, "attention", 0, port)
    ranks.start("attn0-again", joining, "attention", 0, port, delay_s=0.5)
    out = ranks.join(30)
    named = "attention rank 0 (world rank 1) joined twice"
    for name in ("ffn", "attn0", "attn0-again"):
        assert out[name].error_type == "AFDProtocolError", out[name]
        assert named in out[name].error, out[name].error
        # Found as the second one arrives, long before the 20 s rendezvous timeout.
        assert out[name].elapsed_s < 10, out[name].elapsed_s
    assert "give each attention server its own role_rank (0..1)" in out["attn0-again"].error
