"""The attention role refuses two stages per step until its runners can run them."""

from __future__ import annotations

import pytest

from afd_attention.hooks import check_num_stages
from afd_core.config import AFDConfig
from afd_core.errors import AFDConfigError


def test_two_stages_are_refused_at_start_up_rather_than_run_as_one() -> None:
    with pytest.raises(AFDConfigError, match=r"num_stages 2 is not supported") as info:
        check_num_stages(AFDConfig(role="attention", connector="C", num_stages=2))
    assert str(info.value).endswith('set "num_stages": 1 on both roles')


def test_one_stage_is_accepted() -> None:
    check_num_stages(AFDConfig(role="attention", connector="C"))
