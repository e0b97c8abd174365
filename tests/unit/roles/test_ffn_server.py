"""FFNServer: the connector-driven loop, its stats, its stop and its failures."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

from afd_core.errors import AFDConfigError, AFDPeerError, AFDProtocolError
from afd_ffn.server import THREAD_NAME, FFNServer, describe_failure
from tests.unit.roles.fakes import FakeFFNModel, RecordingConnector, ffn_step, make_config

TIMEOUT_S = 5.0


class Harness:
    """An FFNServer over a RecordingConnector, with failures and contexts recorded."""

    def __init__(
        self,
        model: FakeFFNModel | None = None,
        device: str | None = None,
        replacements: list[RecordingConnector] | None = None,
        idle_limit_s: float = 0.0,
    ) -> None:
        self.connector = RecordingConnector(make_config("ffn"), 0)
        self.model = model or FakeFFNModel()
        self.failures: list[BaseException] = []
        self.failed = threading.Event()
        self.contexts = 0
        self.replacements = list(replacements or [])
        self.server = FFNServer(
            self.connector,
            self.model,
            compute_context=self._context,
            on_failure=self._on_failure,
            device=device,
            reconnect=lambda: self.replacements.pop(0),
            idle_limit_s=idle_limit_s,
        )

    @contextmanager
    def _context(self):
        self.contexts += 1
        yield

    def _on_failure(self, exc: BaseException) -> None:
        self.failures.append(exc)
        self.failed.set()

    def run_until_closed(self, *items) -> None:
        """Queue ``items`` then the end of the stream; wait for the thread to end."""
        for item in items:
            self.connector.steps.put(item)
        self.connector.steps.put(None)
        started = time.perf_counter()
        self.server.start()
        self.server._thread.join(TIMEOUT_S)
        self.elapsed_s = time.perf_counter() - started
        assert not self.server.is_running


def test_each_step_computes_every_stage_of_every_layer_layer_major_and_sends_it_back():
    h = Harness()
    h.run_until_closed(ffn_step(0, 5), ffn_step(1, 1, 2))
    assert h.connector.calls("ffn_recv") == [
        (0, 0, 0), (0, 1, 0), (0, 2, 0),
        (1, 0, 0), (1, 0, 1),
        (1, 1, 0), (1, 1, 1),
        (1, 2, 0), (1, 2, 1),
    ]  # fmt: skip
    assert h.model.calls[:3] == [(0, (5, 8)), (1, (5, 8)), (2, (5, 8))]
    sent = h.connector.calls("ffn_send")
    assert [s[:2] for s in sent[:3]] == [(0, 0), (0, 1), (0, 2)]
    assert sent[0][2] == ("ffn", 0, (5, 8))
    assert h.connector.events[0] == ("initialize",)


class DeviceRecordingModel(FakeFFNModel):
    """Records the device of every hidden-states tensor the FFN computes on."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: list[str] = []

    def afd_compute_ffn(self, layer, hidden, router_logits):
        self.devices.append(hidden.device)
        return super().afd_compute_ffn(layer, hidden, router_logits)


def test_received_hidden_states_move_to_the_compute_device_before_the_ffn_runs():
    h = Harness(DeviceRecordingModel(), device="cuda:0")
    h.run_until_closed(ffn_step(0, 5))
    assert h.model.devices == ["cuda:0"] * 3
    assert not h.failures


def test_without_a_compute_device_the_ffn_gets_the_received_tensors_as_they_are():
    h = Harness(DeviceRecordingModel())
    h.run_until_closed(ffn_step(0, 5))
    assert h.model.devices == ["cpu"] * 3


def test_stats_count_steps_stages_layer_batches_and_tokens():
    h = Harness()
    h.run_until_closed(ffn_step(0, 5), ffn_step(1, 1, 2, attention_rank=1))
    counters = h.server.stats.as_dict()
    busy_s = counters.pop("busy_s")
    assert 0.0 < busy_s < h.elapsed_s  # the 9 layer batches took some of the run's time
    assert 0.0 <= counters.pop("rendezvous_s") < h.elapsed_s
    assert counters == {
        "steps": 2,
        "layer_exchanges": 9,
        "tokens": 8,
        "tokens_by_attention_rank": {"0": 5, "1": 1 + 2},
        "stages": 3,
        "two_stage_steps": 1,
        "rows": 5 * 3 + (1 + 2) * 3,  # every layer of every stage
        "graphs_captured": 0,
        "graph_replays": 0,
        "graph_steps_eager": 0,
        "rendezvous": 1,
        "work_items": 0,
    }


def test_each_step_runs_inside_one_compute_context():
    h = Harness()
    h.run_until_closed(ffn_step(0, 1), ffn_step(1, 1), ffn_step(2, 1))
    assert h.contexts == 3


def test_a_closed_control_plane_ends_the_loop_without_a_failure():
    h = Harness()
    h.run_until_closed()
    assert h.server.error is None and h.failures == []


def test_stop_wakes_a_server_waiting_for_a_step():
    h = Harness()
    h.server.start()
    assert h.server.is_running
    assert h.server.stop(TIMEOUT_S)
    assert not h.server.is_running
    assert h.connector.is_closed and h.failures == []


@pytest.mark.parametrize(
    "exc",
    [
        AFDPeerError("attention rank 0 closed the connection"),
        AFDProtocolError("layer 1 where layer 0 was expected"),
    ],
)
def test_a_connector_error_is_recorded_closes_the_connector_and_reports_the_failure(exc):
    h = Harness()
    h.connector.fail_recv = exc
    h.run_until_closed(ffn_step(0, 3))
    assert h.server.error is exc and h.failures == [exc]
    assert h.connector.closed_from == [THREAD_NAME]


def test_a_model_error_mid_step_fails_the_server():
    h = Harness(FakeFFNModel(fail_at=1))
    h.run_until_closed(ffn_step(0, 3), ffn_step(1, 3))
    assert isinstance(h.server.error, RuntimeError)
    assert h.failures == [h.server.error]
    assert h.server.stats.steps == 0 and h.server.stats.layer_exchanges == 1


def test_a_bad_control_payload_fails_the_server():
    h = Harness()
    h.run_until_closed(AFDProtocolError("bad magic"))
    assert isinstance(h.server.error, AFDProtocolError)


def test_errors_after_stop_was_requested_are_not_failures():
    h = Harness()
    h.connector.fail_recv = AFDPeerError("connection reset while closing")
    h.server._stopping.set()
    h.run_until_closed(ffn_step(0, 1))
    assert h.server.error is None and h.failures == []


def test_the_server_thread_is_a_named_daemon():
    h = Harness()
    h.server.start()
    try:
        assert h.server._thread.name == THREAD_NAME and h.server._thread.daemon
        with pytest.raises(RuntimeError, match="already called"):
            h.server.start()
    finally:
        h.server.stop(TIMEOUT_S)


def test_a_model_whose_layers_differ_from_the_wire_spec_is_rejected():
    with pytest.raises(AFDConfigError, match=r"exchanges 2 layers"):
        Harness(FakeFFNModel(layers=(0, 1)))


def test_failure_reasons_name_the_kind_of_failure():
    assert "did not arrive, is gone" in describe_failure(AFDPeerError("x"))
    assert "did not expect" in describe_failure(AFDProtocolError("x"))
    assert describe_failure(ValueError("x")) == "ValueError while serving"


def test_attention_ranks_that_leave_are_replaced_at_a_new_rendezvous():
    replacement = RecordingConnector(make_config("ffn"), 0)
    for item in (ffn_step(0, 2), None):
        replacement.steps.put(item)
    h = Harness(replacements=[replacement], idle_limit_s=60)
    h.run_until_closed(ffn_step(0, 4), AFDPeerError("attention rank 0 left"))
    assert h.server.error is None and h.failures == []
    assert h.connector.is_closed and replacement.events[0] == ("initialize",)
    assert h.server.stats.rendezvous == 2 and h.server.stats.steps == 2
    assert [len(c.calls("ffn_recv")) for c in (h.connector, replacement)] == [3, 3]


class Absent(RecordingConnector):
    """A connector whose rendezvous finds no attention rank (its timeout passed)."""

    def connect(self):
        raise AFDPeerError("attention rank 0 did not arrive within 1 s")


def test_the_idle_limit_ends_the_wait_for_new_attention_ranks_with_a_failure():
    absent = [Absent(make_config("ffn"), 0) for _ in range(3)]
    h = Harness(replacements=absent, idle_limit_s=1e-9)
    h.run_until_closed(AFDPeerError("attention rank 0 left"))
    assert isinstance(h.server.error, AFDPeerError)
    assert "no attention rank came within ffn_idle_limit_s" in str(h.server.error)
    assert len(h.replacements) == 2  # one attempt, then the limit had passed


def test_without_an_idle_limit_attention_ranks_leaving_is_a_failure():
    h = Harness(replacements=[RecordingConnector(make_config("ffn"), 0)], idle_limit_s=0)
    left = AFDPeerError("attention rank 0 left")
    h.run_until_closed(left)
    assert h.server.error is left and len(h.replacements) == 1
