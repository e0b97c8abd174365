"""The pairing of an attention endpoint's sends and results (``afd_core.kit.in_flight``):
one exchange in flight per stage (or, deferred, any number in order), each receive
completing its stage's oldest send, of the same layer; every other order is an
AFDProtocolError naming rank, layer and stage."""

from __future__ import annotations

import pytest

from afd_core.errors import AFDProtocolError
from afd_core.kit.in_flight import InFlight


def test_each_stage_pairs_its_send_with_its_receive_in_any_stage_order() -> None:
    flight: InFlight[str] = InFlight("AFD", 3)
    flight.put(0, 0, "s0")
    flight.put(0, 1, "s1")
    assert 0 in flight and 1 in flight
    assert flight.take(0, 1) == "s1"
    assert flight.take(0, 0) == "s0"
    assert 0 not in flight and 1 not in flight


def test_a_second_send_of_a_stage_before_its_receive_is_refused() -> None:
    flight: InFlight[str] = InFlight("AFD CAM P2P", 2)
    flight.put(4, 1, "first")
    with pytest.raises(AFDProtocolError) as info:
        flight.put(5, 1, "second")
    assert str(info.value) == (
        "AFD CAM P2P: attention rank 2 sends layer 5 stage 1 while layer 4 of that stage "
        "awaits recv(); call send() and recv() in pairs"
    )
    assert flight.take(4, 1) == "first"


@pytest.mark.parametrize(
    ("sent_layer", "says"), [(None, "sent nothing"), (0, "sent layer 0 first")]
)
def test_a_receive_of_another_layer_or_of_nothing_is_refused(sent_layer, says) -> None:
    flight: InFlight[str] = InFlight("AFD", 0)
    if sent_layer is not None:
        flight.put(sent_layer, 0, "x")
    with pytest.raises(AFDProtocolError, match=rf"result of layer 1 stage 0, but {says} for"):
        flight.take(1, 0)


def test_clear_forgets_every_stage() -> None:
    flight: InFlight[int] = InFlight("AFD", 0)
    flight.put(0, 0, 1)
    flight.clear()
    flight.check_free(0, 0)


def test_deferred_receives_take_each_stage_s_sends_oldest_first() -> None:
    flight: InFlight[str] = InFlight("AFD CAM async", 1, depth=None)
    for layer in (1, 2, 3):
        flight.put(layer, 0, f"l{layer}")
    flight.put(1, 1, "other stage")
    with pytest.raises(AFDProtocolError, match="result of layer 2 stage 0, but sent layer 1 first"):
        flight.take(2, 0)
    assert [flight.take(layer, 0) for layer in (1, 2, 3)] == ["l1", "l2", "l3"]
    assert 0 not in flight and flight.take(1, 1) == "other stage"
