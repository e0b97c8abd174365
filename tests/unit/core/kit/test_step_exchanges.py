"""StepExchanges: every layer, every stage, once, in order (pure Python)."""

from __future__ import annotations

import pytest

from afd_core.errors import AFDProtocolError
from afd_core.kit.step_exchanges import StepExchanges


def test_each_stage_takes_the_layers_in_order_and_the_rows_follow_stage_then_layer():
    rule = StepExchanges((1, 3), "attention rank 0")
    rule.begin(5, 2)
    assert [rule.take(1, 0), rule.take(1, 1), rule.take(3, 1), rule.take(3, 0)] == [0, 2, 3, 1]
    assert [rule.finish() for _ in range(4)] == [False, False, False, True]
    assert rule.complete


def test_a_layer_out_of_order_or_twice_names_both_layers():
    rule = StepExchanges((1, 3), "attention rank 0")
    rule.begin(5, 1)
    with pytest.raises(AFDProtocolError, match=r"exchanged layer 3 in stage 0 of step 5 where "
                       r"layer 1 \(exchange 1 of 2\) was expected"):  # fmt: skip
        rule.take(3, 0)
    rule.take(1, 0)
    with pytest.raises(AFDProtocolError, match=r"layer 1 in stage 0 .* where layer 3"):
        rule.take(1, 0)
    rule.take(3, 0)
    with pytest.raises(AFDProtocolError, match=r"after step 5 exchanged all its 2 layers"):
        rule.take(1, 0)


def test_a_step_may_not_begin_before_the_previous_one_made_every_exchange():
    rule = StepExchanges((0, 1), "FFN rank 1")
    rule.begin(0, 1)
    rule.take(0, 0)
    rule.finish()
    with pytest.raises(AFDProtocolError, match=r"FFN rank 1 starts step 1 after 1 of the 2"):
        rule.begin(1, 1)


def test_unknown_layers_and_stages_and_exchanges_before_a_step_are_refused():
    rule = StepExchanges((0, 1), "attention rank 0")
    with pytest.raises(AFDProtocolError, match="before any step began"):
        rule.take(0, 0)
    rule.begin(0, 1)
    with pytest.raises(AFDProtocolError, match=r"layer 7 is not an exchange layer"):
        rule.take(7, 0)
    with pytest.raises(AFDProtocolError, match=r"stage 1 is outside step 0's 1 stage"):
        rule.take(0, 1)


def test_a_step_without_exchanges_is_complete_at_once_and_refuses_any():
    rule = StepExchanges((0,), "attention rank 0")
    rule.begin(3, 1, exchanges=False)
    assert rule.complete
    with pytest.raises(AFDProtocolError, match="makes no layer exchange through the endpoint"):
        rule.take(0, 0)
    rule.begin(4, 1)  # the next step may follow
