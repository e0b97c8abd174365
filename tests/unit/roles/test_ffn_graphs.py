"""FFNStepGraphs: which graph steps are captured, replayed or served eagerly.

CPU only: a fake connector delivers known inputs and records outputs, and a fake
``_capture`` stands in for CUDA graph capture (the capture itself runs on the H200s in
tests/e2e_gpu). The policy under test: capture on capture steps up to the cache bound,
replay cached shapes (least recently used dropped first), serve others eagerly.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import FFNStep, WireSpec  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from afd_ffn.loops.graph_steps import FFNStepGraphs, _CapturedStep, shape_key  # noqa: E402
from afd_ffn.stats import FFNStats  # noqa: E402

WIRE = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=2)


class FakeFFNEndpoint:
    """Delivers ``layer + 1`` in every input row; records calls, sends and stream waits."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.sent: list[tuple[int, Any]] = []
        self.waits: list[str] = []

    def recv_into(self, step, layer, stage, hidden, router_logits) -> None:
        self.calls.append(("recv_into", layer, stage))
        hidden.fill_(float(layer + 1))

    def send_from(self, step, layer, stage, output) -> None:
        self.calls.append(("send_from", layer, stage))
        self.sent.append((layer, output.clone()))

    def wait_for_stream(self, what: str) -> None:
        self.waits.append(what)


class FakeConnector:
    """A connector whose FFN endpoint is a :class:`FakeFFNEndpoint` (``ffn``)."""

    wire = WIRE

    def __init__(self) -> None:
        self.ffn = FakeFFNEndpoint()


class Doubler:
    def afd_exchange_layers(self) -> tuple[int, ...]:
        return (0, 1)

    def afd_compute_ffn(self, layer: int, hidden: Any, router_logits: Any) -> Any:
        return hidden * 2


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def graph_step(step_id: int, *counts: int, capturing: bool = False) -> FFNStep:
    """A graph step of attention rank 0 with ``counts[s]`` tokens in stage ``s``."""
    stages = tuple(AFDDPMetadata(0, (n,)) for n in counts)
    payload = ControlPayload(step_id, 0, stages, is_graph_capturing=capturing, is_graph_step=True)
    return FFNStep((payload,), (0,), (counts,))


def make(max_graphs: int) -> tuple[FFNStepGraphs, FakeConnector, FFNStats]:
    connector, stats = FakeConnector(), FFNStats()
    graphs = FFNStepGraphs(
        connector, Doubler(), (0, 1), device=torch.device("cpu"), max_graphs=max_graphs, stats=stats
    )

    def fake_capture(step: FFNStep, key) -> None:  # the bookkeeping of the real _capture
        graphs._cache[key] = _CapturedStep(FakeGraph(), [])
        stats.graphs_captured += 1
        while len(graphs._cache) > max_graphs:
            graphs._cache.popitem(last=False)

    graphs._capture = fake_capture
    return graphs, connector, stats


def test_without_a_cache_capture_steps_move_nothing_and_graph_steps_run_eagerly():
    graphs, connector, stats = make(0)
    graphs.serve(graph_step(0, 3, capturing=True))
    assert connector.ffn.sent == [] and stats.graphs_captured == 0
    graphs.serve(graph_step(1, 3))
    assert [(layer, out.shape) for layer, out in connector.ffn.sent] == [
        (0, (3, 4)),
        (1, (3, 4)),
    ]
    assert torch.equal(connector.ffn.sent[1][1], torch.full((3, 4), 4.0))
    assert stats.graph_steps_eager == 1 and stats.graph_replays == 0


def test_a_graph_step_of_two_stages_runs_layer_major():
    graphs, connector, _ = make(0)
    graphs.serve(graph_step(0, 2, 3))
    assert connector.ffn.calls == [
        (call, layer, stage)
        for layer in (0, 1)
        for stage in (0, 1)
        for call in ("recv_into", "send_from")
    ]
    assert [out.shape for _, out in connector.ffn.sent] == [(2, 4), (3, 4)] * 2


def test_cached_shapes_replay_and_the_least_recently_used_is_dropped():
    graphs, connector, stats = make(2)
    for step_id, n in enumerate((1, 2)):
        graphs.serve(graph_step(step_id, n, capturing=True))
    graphs.serve(graph_step(2, 1))  # replays 1: now 2 is the least recently used
    graphs.serve(graph_step(3, 4, capturing=True))  # drops 2
    assert graphs.cached_shapes == (shape_key(graph_step(0, 1)), shape_key(graph_step(0, 4)))
    graphs.serve(graph_step(4, 2))  # no graph any more: eager
    graphs.serve(graph_step(5, 4))
    assert stats.graphs_captured == 3
    assert stats.graph_replays == 2 and stats.graph_steps_eager == 1
    assert len(connector.ffn.waits) == 2  # every replay is waited for, bounded
    assert connector.ffn.sent and all(layer in (0, 1) for layer, _ in connector.ffn.sent)


def test_a_capture_step_of_a_cached_shape_captures_nothing_new():
    graphs, _, stats = make(4)
    graphs.serve(graph_step(0, 8, capturing=True))
    graphs.serve(graph_step(1, 8, capturing=True))
    assert stats.graphs_captured == 1
