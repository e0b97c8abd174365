"""StepDriver: step numbering, control payloads, per-layer exchanges and protocol checks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from afd_attention.stage_scheduler import StageScheduler
from afd_attention.step_driver import METADATA_KEY, SCHEDULED, WARMUP, StepDriver, StepFlags
from afd_core.errors import AFDProtocolError
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from tests.unit.roles.fakes import (
    WIRE,
    FakeStream,
    FakeTensor,
    RecordingConnector,
    make_config,
)


class Forward:
    """The ``additional_kwargs`` of one forward; a new Forward is a new forward context."""

    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}


def make_driver(
    role_rank: int = 0,
    *,
    attention: int = 1,
    ffn: int = 1,
    wire=WIRE,
    layers=None,
    stream: FakeStream | None = None,
) -> tuple[StepDriver, RecordingConnector, list[Forward]]:
    stream = stream or FakeStream()
    connector = RecordingConnector(make_config(attention=attention, ffn=ffn), role_rank, wire)
    forwards = [Forward()]
    driver = StepDriver(
        connector,
        wire,
        role_rank,
        exchange_layers=layers,
        step_slot=lambda: forwards[-1].kwargs,
        is_capturing=stream.is_capturing,
    )
    return driver, connector, forwards


def run_layers(driver: StepDriver, tokens: int, layers=(0, 1, 2)) -> list[FakeTensor]:
    return [driver.exchange(FakeTensor((tokens, 8)), None, layer) for layer in layers]


def test_begin_step_sends_a_payload_with_this_ranks_tokens_and_installs_metadata():
    driver, connector, forwards = make_driver(role_rank=2, attention=3)
    metadata = driver.begin_step(5)
    assert forwards[-1].kwargs[METADATA_KEY] is metadata
    assert metadata.step_id == 0 and metadata.padded_lens == (5,)
    (payload,) = [c[0] for c in connector.calls("begin_step")]
    assert payload == ControlPayload(
        step_id=0, sender_rank=2, stages=(AFDDPMetadata(first_rank=2, num_tokens=(5,)),)
    )
    assert not (payload.is_warmup or payload.is_profile or payload.is_graph_capturing)


def test_exchange_sends_the_layer_and_stage_and_receives_their_result():
    driver, connector, _ = make_driver(role_rank=3, attention=4, ffn=2)
    driver.begin_step(7)
    hidden = FakeTensor((7, 8))
    out = driver.exchange(hidden, None, 0)
    assert connector.calls("send") == [(0, 0, hidden, None, None)]
    assert connector.calls("recv") == [(0, 0)]
    assert out.shape == (7, 8) and out is not hidden


def test_each_layer_returns_a_fresh_output_tensor():
    driver, _, _ = make_driver()
    driver.begin_step(4)
    outputs = run_layers(driver, 4)
    assert len({id(t) for t in outputs}) == 3
    assert all(t.shape == (4, 8) for t in outputs)


def test_steps_are_numbered_one_after_another_across_forwards():
    driver, connector, forwards = make_driver()
    for tokens in (3, 1, 1):
        forwards.append(Forward())
        driver.begin_step(tokens)
        run_layers(driver, tokens)
    assert [c[0].step_id for c in connector.calls("begin_step")] == [0, 1, 2]
    assert [c[0] for c in connector.calls("send")] == [0, 1, 2] * 3
    assert driver.completed_steps == 3


def test_a_forward_without_metadata_begins_a_warmup_step_from_the_hidden_states():
    driver, connector, forwards = make_driver()
    run_layers(driver, 2048)
    (payload,) = [c[0] for c in connector.calls("begin_step")]
    assert payload.tokens_of(0) == (2048,)
    assert payload.is_warmup and not payload.is_profile
    assert forwards[-1].kwargs[METADATA_KEY].padded_lens == (2048,)


def test_dummy_flags_label_lazily_begun_steps_and_are_restored_afterwards():
    driver, connector, forwards = make_driver()
    profile = StepFlags(is_profile=True)
    with driver.dummy_flags(profile):
        run_layers(driver, 16)
    forwards.append(Forward())
    run_layers(driver, 1)
    first, second = [c[0] for c in connector.calls("begin_step")]
    assert first.is_profile and not first.is_warmup
    assert second.is_warmup and not second.is_profile


def test_explicit_begin_step_ignores_dummy_flags():
    driver, connector, _ = make_driver()
    with driver.dummy_flags(WARMUP):
        driver.begin_step(3, SCHEDULED)
    (payload,) = [c[0] for c in connector.calls("begin_step")]
    assert not payload.is_warmup


# The rule of a step's exchanges is the endpoint's; the driver counts nothing and passes
# the endpoint's errors on (the recording endpoint keeps afd-core's StepExchanges).


def test_layers_out_of_order_raise_the_endpoints_protocol_error_naming_both_layers():
    driver, _, _ = make_driver()
    driver.begin_step(2)
    driver.exchange(FakeTensor((2, 8)), None, 0)
    with pytest.raises(AFDProtocolError, match=r"layer 2 in stage 0 of step 0 where layer 1"):
        driver.exchange(FakeTensor((2, 8)), None, 2)


def test_a_new_step_before_the_previous_one_exchanged_every_layer_is_a_protocol_error():
    driver, _, forwards = make_driver()
    driver.begin_step(2)
    driver.exchange(FakeTensor((2, 8)), None, 0)
    forwards.append(Forward())
    with pytest.raises(AFDProtocolError, match=r"starts step 1 after 1 of the 3 layer"):
        driver.begin_step(2)


def test_exchanging_past_the_last_layer_in_one_forward_is_a_protocol_error():
    driver, _, _ = make_driver()
    driver.begin_step(2)
    run_layers(driver, 2)
    with pytest.raises(AFDProtocolError, match=r"after step 0 exchanged all its 3 layers"):
        driver.exchange(FakeTensor((2, 8)), None, 0)


def test_step_metadata_of_another_forward_is_a_protocol_error():
    driver, _, forwards = make_driver()
    driver.begin_step(2)
    stale = forwards[-1].kwargs[METADATA_KEY]
    run_layers(driver, 2)
    forwards.append(Forward())
    driver.begin_step(2)
    forwards[-1].kwargs[METADATA_KEY] = stale
    with pytest.raises(AFDProtocolError, match=r"carries step 0, but the step begun last is 1"):
        driver.exchange(FakeTensor((2, 8)), None, 0)


def test_a_token_count_other_than_the_steps_is_a_protocol_error():
    driver, connector, _ = make_driver()
    driver.begin_step(5)
    with pytest.raises(AFDProtocolError, match=r"4 tokens where the step announced 5"):
        driver.exchange(FakeTensor((4, 8)), None, 0)
    assert connector.calls("send") == []


def test_router_logits_travel_only_when_the_wire_spec_has_them():
    gated = replace(WIRE, router_logits_width=4)
    logits = FakeTensor((2, 4), dtype="torch.float32")
    for wire, expected in ((WIRE, None), (gated, logits)):
        driver, connector, _ = make_driver(wire=wire)
        driver.begin_step(2)
        driver.exchange(FakeTensor((2, 8)), logits, 0)
        (sent,) = connector.calls("send")
        assert sent[3] is expected


def test_custom_exchange_layers_are_exchanged_in_their_order():
    wire = replace(WIRE, exchange_layer_ids=(1, 3, 5))
    driver, connector, _ = make_driver(wire=wire, layers=(1, 3, 5))
    driver.begin_step(1)
    run_layers(driver, 1, layers=(1, 3, 5))
    assert [c[0] for c in connector.calls("send")] == [1, 3, 5]
    assert driver.completed_steps == 1


def test_exchange_layers_must_be_the_wire_specs():
    with pytest.raises(ValueError, match=r"exchanges layers \(0, 1\) but the wire spec"):
        make_driver(layers=(0, 1))


# Two stages ----------------------------------------------------------------------------


class StageForwards:
    """A forward context per stage; each stage's turn installs its own (as the runner
    installs vLLM's forward context at every hand-off)."""

    def __init__(self) -> None:
        self.kwargs: list[dict[str, Any]] = [{}, {}]
        self.current: dict[str, Any] | None = None

    @contextmanager
    def turn(self, stage: int) -> Iterator[None]:
        previous, self.current = self.current, self.kwargs[stage]
        try:
            yield
        finally:
            self.current = previous

    def slot(self) -> dict[str, Any]:
        assert self.current is not None, "an exchange ran outside a stage's turn"
        return self.current


@pytest.fixture
def staged() -> Iterator[tuple[StepDriver, RecordingConnector, StageScheduler, StageForwards]]:
    forwards = StageForwards()
    scheduler = StageScheduler(timeout_s=10.0, turn_context=forwards.turn)
    connector = RecordingConnector(make_config(), 0, WIRE)
    driver = StepDriver(
        connector,
        WIRE,
        0,
        step_slot=forwards.slot,
        is_capturing=FakeStream().is_capturing,
        after_send=scheduler.checkpoint,
    )
    yield driver, connector, scheduler, forwards
    scheduler.close()


def test_a_two_stage_step_announces_both_stages_once_and_exchanges_them_in_turns(staged):
    driver, connector, scheduler, forwards = staged
    for stage, metadata in enumerate(driver.begin_stages((3, 2))):
        assert (metadata.stage_index, metadata.padded_lens) == (stage, (3, 2))
        forwards.kwargs[stage][METADATA_KEY] = metadata
    scheduler.run_step([lambda: run_layers(driver, 3), lambda: run_layers(driver, 2)])
    [payload] = [e[1] for e in connector.events if e[0] == "begin_step"]
    assert payload.stages == (AFDDPMetadata(0, (3,)), AFDDPMetadata(0, (2,)))
    exchanges = [e[:3] for e in connector.events if e[0] in ("send", "recv")]
    assert exchanges == [
        ("send", 0, 0), ("send", 0, 1),
        ("recv", 0, 0), ("send", 1, 0),
        ("recv", 0, 1), ("send", 1, 1),
        ("recv", 1, 0), ("send", 2, 0),
        ("recv", 1, 1), ("send", 2, 1),
        ("recv", 2, 0), ("recv", 2, 1),
    ]  # fmt: skip
    assert (driver.completed_steps, driver.two_stage_steps) == (1, 1)
    driver.begin_stages((1, 1))  # the endpoint saw every layer of both stages


def test_a_stage_with_another_token_count_than_announced_fails_the_step(staged):
    driver, _, scheduler, forwards = staged
    for stage, metadata in enumerate(driver.begin_stages((3, 2))):
        forwards.kwargs[stage][METADATA_KEY] = metadata
    with pytest.raises(
        AFDProtocolError, match="layer 0 of step 0 has 3 tokens where the step announced 2"
    ):
        scheduler.run_step([lambda: run_layers(driver, 3), lambda: run_layers(driver, 3)])
    assert driver.completed_steps == 0


def test_two_stages_never_begin_on_a_capturing_stream():
    stream = FakeStream()
    driver, connector, _ = make_driver(stream=stream)
    stream.capturing = True
    with pytest.raises(AFDProtocolError, match="two-stage steps run eagerly"):
        driver.begin_stages((2, 2))
    assert connector.events == []


def test_every_result_goes_through_share_output_before_the_model_gets_it():
    """Attention TP: the leader's driver broadcasts each result to the other TP ranks."""
    connector = RecordingConnector(make_config(), 0, WIRE)
    forwards = [Forward()]
    shared: list[FakeTensor] = []

    def share(out: FakeTensor) -> FakeTensor:
        shared.append(out)
        return out

    driver = StepDriver(
        connector,
        WIRE,
        0,
        step_slot=lambda: forwards[-1].kwargs,
        is_capturing=FakeStream().is_capturing,
        share_output=share,
    )
    driver.begin_step(3)
    outputs = run_layers(driver, 3)
    assert shared == outputs
