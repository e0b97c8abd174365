"""FFNServer over real P2P endpoints on the loopback data plane: the orders it serves.

The attention contract lets an attention rank keep one exchange per stage in flight:
``send(L, 0)``, ``send(L, 1)``, ``recv(L, 0)``, ``recv(L, 1)``. The FFN server must then
serve layer-major (every stage of layer L before layer L+1). A stage-major loop asks for
layer L+1 of stage 0 while the attention rank waits for layer L of stage 1: over a
transport that matches messages by layer and stage that is a deadlock; over a
first-in-first-out lane (this loopback, gloo) the FFN rank gets stage 1's message of
layer L instead and fails. Every wait here is bounded (the connectors' timeout, the
joins), so either way such a loop fails the test instead of hanging the suite.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import WireSpec  # noqa: E402
from afd_core.runtime.messages import frames  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from afd_ffn.server import FFNServer  # noqa: E402
from tests.unit.core.loopback import DATA_PLANES, close_all, loopback_connectors  # noqa: E402

LAYERS = 3
WIRE = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=LAYERS)
TIMEOUT_S = 5  # the connectors' bound on every wait
JOIN_S = 4 * TIMEOUT_S


class AffineFFN:
    """An FFN whose output names its layer: ``10 * hidden + layer``."""

    def afd_exchange_layers(self) -> tuple[int, ...]:
        return tuple(range(LAYERS))

    def afd_compute_ffn(self, layer: int, hidden: Any, router_logits: Any) -> Any:
        return hidden * 10 + layer


def two_stage_payload(rank: int, step_id: int, counts: tuple[int, int]) -> ControlPayload:
    stages = tuple(AFDDPMetadata(rank, (n,)) for n in counts)
    return ControlPayload(step_id, rank, stages)


def stage_input(rank: int, step_id: int, layer: int, stage: int, rows: int) -> Any:
    """A tensor that tells apart every (rank, step, layer, stage) of the test."""
    return torch.full(
        (rows, WIRE.hidden_size), float(1000 * rank + 100 * step_id + 10 * layer + stage)
    )


def drive_two_stages_in_flight(
    connector: Any, counts: tuple[int, int], steps: int, results: dict[int, Any]
) -> None:
    """Attention rank ``connector``: per layer send both stages, then receive both."""
    rank, endpoint = connector.role_rank, connector.attention
    try:
        for step_id in range(steps):
            endpoint.begin_step(two_stage_payload(rank, step_id, counts))
            for layer in range(LAYERS):
                sent = [stage_input(rank, step_id, layer, s, n) for s, n in enumerate(counts)]
                for stage, hidden in enumerate(sent):
                    endpoint.send(layer, stage, hidden)
                for stage, hidden in enumerate(sent):
                    got = endpoint.recv(layer, stage)
                    assert torch.equal(got.cpu(), hidden * 10 + layer), (rank, step_id, layer)
        results[rank] = "ok"
    except BaseException as exc:  # reported by the test thread
        results[rank] = exc


@pytest.fixture(params=["frames", "header-messages"])
def message_form(request, monkeypatch):
    """Host-plane messages as frames (the tests' sizes), or all above the frame limit."""
    if request.param == "header-messages":
        monkeypatch.setattr(frames, "FRAME_LIMIT_BYTES", 0)
    return request.param


@pytest.mark.parametrize("num_attention", [1, 2])
@pytest.mark.parametrize("data_plane", DATA_PLANES)
def test_attention_ranks_with_both_stages_of_a_layer_in_flight_are_served_layer_major(
    data_plane, message_form, num_attention
):
    attention, ffn = loopback_connectors(
        num_attention, 1, WIRE, timeout_s=TIMEOUT_S, data_plane=data_plane
    )
    failures: list[BaseException] = []
    server = FFNServer(ffn[0], AffineFFN(), compute_context=nullcontext, on_failure=failures.append)
    results: dict[int, Any] = {}
    drivers = [
        threading.Thread(
            target=drive_two_stages_in_flight, args=(conn, (2, 3), 2, results), daemon=True
        )
        for conn in attention
    ]
    try:
        server.start()
        for driver in drivers:
            driver.start()
        for driver in drivers:
            driver.join(JOIN_S)
        assert not any(d.is_alive() for d in drivers), "an attention rank is still waiting"
        assert results == dict.fromkeys(range(num_attention), "ok"), server.error
        assert server.error is None and failures == []
    finally:
        close_all(attention)
        assert server.stop(JOIN_S)
        close_all(ffn)
    assert server.stats.steps >= 2
    assert server.stats.layer_exchanges == server.stats.steps * LAYERS * 2
