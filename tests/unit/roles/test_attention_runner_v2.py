"""AttentionRunnerV2Mixin: every Model Runner V2 forward becomes one AFD step, labelled."""

from __future__ import annotations

from typing import Any

import pytest

from afd_attention.runner import AttentionRunnerV2Mixin
from afd_attention.step_driver import METADATA_KEY, StepDriver, StepFlags
from afd_core.errors import AFDError
from tests.unit.roles.fakes import (
    WIRE,
    FakeStream,
    FakeTensor,
    RecordingConnector,
    make_config,
)


class FakeV2Runner:
    """Model Runner V2's ``execute_model``/``_dummy_run``/``capture_model`` in miniature.

    As in vLLM, the forward context (here ``forward_kwargs``) only exists inside
    ``execute_model``, right before the model runs; a batch without tokens runs nothing.
    """

    def __init__(self) -> None:
        self.forward_kwargs: dict[str, Any] = {}
        self.driver: StepDriver | None = None
        self.stream = FakeStream()

    # The signature of vLLM 0.32's Model Runner V2 execute_model.
    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                      skip_attn_for_dummy_run=False, is_profile=False, context_len=0,
                      valid_dummy_state_slots=False, randomize_inputs=False):  # fmt: skip
        num_tokens = scheduler_output
        if not num_tokens:
            return None
        self.forward_kwargs = {}
        for layer in range(WIRE.num_exchange_layers):
            self.driver.exchange(FakeTensor((num_tokens, 8)), None, layer)
        return "output"

    def _dummy_run(self, num_tokens, *args, is_profile=False, **kwargs):
        return self.execute_model(num_tokens, dummy_run=True, is_profile=is_profile)

    def capture_model(self, *, profile_only=False):
        # As vLLM's graph manager: per size a warm-up forward, then the captured one.
        for num_tokens in (4, 2):
            self._dummy_run(num_tokens)
            self.stream.capturing = True
            self._dummy_run(num_tokens)
            self.stream.capturing = False
        return 0


class AFDRunnerV2(AttentionRunnerV2Mixin, FakeV2Runner):
    pass


def make_runner() -> tuple[AFDRunnerV2, RecordingConnector]:
    runner = AFDRunnerV2()
    connector = RecordingConnector(make_config(), 0)
    runner.afd_driver = runner.driver = StepDriver(
        connector,
        WIRE,
        0,
        step_slot=lambda: runner.forward_kwargs,
        is_capturing=runner.stream.is_capturing,
    )
    return runner, connector


def flags_sent(connector: RecordingConnector) -> list[tuple[int, StepFlags]]:
    return [
        (p.tokens_of(0)[0], StepFlags(p.is_warmup, p.is_graph_capturing, p.is_profile))
        for (p,) in connector.calls("begin_step")
    ]


def test_a_scheduled_forward_is_one_scheduled_step_with_the_model_token_count():
    runner, connector = make_runner()
    assert runner.execute_model(7) == "output"
    assert flags_sent(connector) == [(7, StepFlags())]
    assert runner.forward_kwargs[METADATA_KEY].step_id == 0
    assert runner.afd_driver.completed_steps == 1


def test_a_scheduled_batch_without_tokens_sends_no_step():
    runner, connector = make_runner()
    runner.execute_model(0)
    runner.execute_model(3)
    assert flags_sent(connector) == [(3, StepFlags())]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [({}, StepFlags(is_warmup=True)), ({"is_profile": True}, StepFlags(is_profile=True))],
)
def test_dummy_forwards_are_labelled_by_purpose(kwargs, expected):
    runner, connector = make_runner()
    runner._dummy_run(5, **kwargs)
    assert flags_sent(connector) == [(5, expected)]


def test_graph_capture_forwards_are_capture_steps_and_later_forwards_are_scheduled():
    runner, connector = make_runner()
    runner.capture_model()
    runner.execute_model(1)
    warmup, capture = StepFlags(is_warmup=True), StepFlags(is_graph_capturing=True)
    assert flags_sent(connector) == [
        (4, warmup),
        (4, capture),
        (2, warmup),
        (2, capture),
        (1, StepFlags()),
    ]
    graph_steps = [c[0].is_graph_step for c in connector.calls("begin_step")]
    assert graph_steps == [False, True, False, True, False]


class FakeGraphManager:
    """Model Runner V2's graph manager: ``run_fullgraph(desc)`` replays one graph."""

    def __init__(self) -> None:
        self.replayed: list[int] = []

    def run_fullgraph(self, desc):
        self.replayed.append(desc.num_tokens)
        return "replayed"


class Desc:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens


def test_capture_model_makes_every_full_graph_replay_announced_and_watched():
    runner, connector = make_runner()
    runner.cudagraph_manager = manager = FakeGraphManager()
    runner.capture_model()
    runner.capture_model()  # wrapping twice would announce each replay twice
    connector.events.clear()
    assert manager.run_fullgraph(Desc(8)) == "replayed"
    assert manager.replayed == [8]
    ((payload,),) = connector.calls("begin_step")
    assert payload.is_graph_step and not payload.is_graph_capturing
    assert payload.tokens_of(0) == (8,) and payload.step_id == 8
    assert connector.events[-1] == ("watch_graph_replay", 8)


def test_a_forward_before_the_driver_is_set_raises_a_clear_error():
    runner = AFDRunnerV2()
    with pytest.raises(AFDError, match=r"before the AFD connector was set up"):
        runner.execute_model(1)
