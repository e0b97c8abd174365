"""AttentionRunnerMixin: every runner forward becomes exactly one AFD step."""

from __future__ import annotations

from typing import Any

import pytest

from afd_attention.runner import AttentionRunnerMixin, dummy_run_flags
from afd_attention.step_driver import METADATA_KEY, StepDriver, StepFlags
from afd_core.errors import AFDError
from tests.unit.roles.fakes import (
    WIRE,
    FakeStream,
    FakeTensor,
    RecordingConnector,
    make_config,
)


class FakeV1Runner:
    """The two V1 runner methods the mixin wraps; the "model" runs the exchange op."""

    def __init__(self) -> None:
        self.forward_kwargs: dict[str, Any] = {}
        self.driver: StepDriver | None = None
        self.stream = FakeStream()
        #: What the forward context asks for: a FULL graph replay (True) or not.
        self.replaying = False

    def _run_model(self, num_tokens: int) -> str:
        self.forward_kwargs = {}  # vLLM sets a fresh forward context per forward
        for layer in range(WIRE.num_exchange_layers):
            self.driver.exchange(FakeTensor((num_tokens, 8)), None, layer)
        return "hidden"

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                       inputs_embeds=None, **model_kwargs):  # fmt: skip
        tokens = input_ids if input_ids is not None else inputs_embeds
        if not self.replaying:  # a graph replay runs no Python
            for layer in range(WIRE.num_exchange_layers):
                self.driver.exchange(FakeTensor((tokens.shape[0], 8)), None, layer)
        return ("forward", model_kwargs)

    # The signature of vLLM 0.32's GPUModelRunner._dummy_run.
    def _dummy_run(self, num_tokens, cudagraph_runtime_mode=None, force_attention=False,
                   uniform_decode=False, allow_microbatching=True, skip_eplb=False,
                   is_profile=False, create_mixed_batch=False, remove_lora=True,
                   is_graph_capturing=False, num_active_loras=0, profile_seq_lens=None,
                   randomize_inputs=False):  # fmt: skip
        # vLLM's CUDAGraphWrapper runs the model on a capturing stream for a capture.
        self.stream.capturing = is_graph_capturing
        try:
            return self._run_model(num_tokens)
        finally:
            self.stream.capturing = False


class AFDRunner(AttentionRunnerMixin, FakeV1Runner):
    def _afd_replays_full_graph(self) -> bool:
        return self.replaying


def make_runner() -> tuple[AFDRunner, RecordingConnector]:
    runner = AFDRunner()
    connector = RecordingConnector(make_config(), 0)
    runner.afd_driver = runner.driver = StepDriver(
        connector,
        WIRE,
        0,
        step_slot=lambda: runner.forward_kwargs,
        is_capturing=runner.stream.is_capturing,
    )
    return runner, connector


def payloads(connector: RecordingConnector) -> list[Any]:
    return [c[0] for c in connector.calls("begin_step")]


def test_model_forward_begins_a_scheduled_step_with_the_input_token_count():
    runner, connector = make_runner()
    result = runner._model_forward(input_ids=FakeTensor((6,)), positions=None, extra=1)
    assert result == ("forward", {"extra": 1})
    (payload,) = payloads(connector)
    assert payload.tokens_of(0) == (6,)
    assert not (payload.is_warmup or payload.is_profile or payload.is_graph_capturing)
    assert runner.forward_kwargs[METADATA_KEY].step_id == 0


def test_model_forward_counts_prompt_embeddings_when_there_are_no_input_ids():
    runner, connector = make_runner()
    runner._model_forward(input_ids=None, inputs_embeds=FakeTensor((9, 8)))
    assert payloads(connector)[0].tokens_of(0) == (9,)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, StepFlags(is_warmup=True)),
        ({"is_profile": True}, StepFlags(is_profile=True)),
        ({"is_graph_capturing": True}, StepFlags(is_graph_capturing=True)),
        ({"uniform_decode": True}, StepFlags(is_warmup=True)),
    ],
)
def test_dummy_runs_send_the_flags_of_their_purpose(kwargs, expected):
    runner, connector = make_runner()
    assert runner._dummy_run(4, **kwargs) == "hidden"
    (payload,) = payloads(connector)
    assert payload.tokens_of(0) == (4,)
    flags = StepFlags(payload.is_warmup, payload.is_graph_capturing, payload.is_profile)
    assert flags == expected


def test_dummy_run_flags_read_arguments_passed_by_position():
    runner = FakeV1Runner()
    # is_profile is the 7th argument after num_tokens.
    args = (None, False, False, True, False, True)
    assert dummy_run_flags(runner._dummy_run, 8, args, {}) == StepFlags(is_profile=True)


def test_forwards_after_a_dummy_run_are_scheduled_again():
    runner, connector = make_runner()
    runner._dummy_run(2, is_profile=True)
    runner.forward_kwargs = {}
    runner._model_forward(input_ids=FakeTensor((3,)))
    first, second = payloads(connector)
    assert first.is_profile and not second.is_profile and second.step_id == 1


def test_a_forward_before_the_driver_is_set_raises_a_clear_error():
    runner = AFDRunner()
    with pytest.raises(AFDError, match=r"before the AFD connector was set up"):
        runner._dummy_run(1)
    with pytest.raises(AFDError, match=r"before the AFD connector was set up"):
        runner._model_forward(input_ids=FakeTensor((1,)))


def test_a_capture_dummy_run_is_a_capture_step_of_a_graph():
    runner, connector = make_runner()
    runner._dummy_run(8, is_graph_capturing=True)
    (payload,) = payloads(connector)
    assert payload.is_graph_capturing and payload.is_graph_step and not payload.is_warmup
    assert len(connector.calls("send")) == WIRE.num_exchange_layers


def test_a_full_graph_replay_is_announced_before_it_runs_and_then_watched():
    runner, connector = make_runner()
    runner.replaying = True
    result = runner._model_forward(input_ids=FakeTensor((4,)))
    assert result == ("forward", {})
    (payload,) = payloads(connector)
    assert payload.is_graph_step and not payload.is_graph_capturing
    assert payload.tokens_of(0) == (4,)
    assert [event[0] for event in connector.events] == ["begin_step", "watch_graph_replay"]
    assert connector.events[-1] == ("watch_graph_replay", 0)
    runner.replaying = False
    runner.forward_kwargs = {}
    runner._model_forward(input_ids=FakeTensor((3,)))
    assert not payloads(connector)[-1].is_graph_step and payloads(connector)[-1].step_id == 1
