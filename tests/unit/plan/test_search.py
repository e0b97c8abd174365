"""The planner: what it returns meets the TPOT bound and both roles' memory, its batch is
the largest that does, fixed parts are kept, and impossible requests say why."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_core.errors import AFDConfigError
from afd_core.plan import SLO, Space, load_model_shape, load_profile, plan
from afd_core.plan.costs import LayerCosts
from afd_core.plan.model_shape import model_shape_from_config
from afd_core.plan.step import AFDDeployment, predict_afd
from tests.unit.plan.conftest import MODELS, measured_profile, tiny_config

V3 = load_model_shape(MODELS / "deepseek-v3")
QWEN = load_model_shape(MODELS / "qwen3-235b-a22b-fp8")
TINY = model_shape_from_config(tiny_config("tiny-qwen3-moe"))


@settings(max_examples=40, deadline=None)
@given(
    case=st.sampled_from(
        [
            (V3, "h200"),
            (QWEN, "h100"),
            (V3, "ascend-910c-die"),
            (TINY, "cpu-core"),
            (TINY, "measured"),
        ]
    ),
    devices=st.integers(2, 24),
    tpot_ms=st.floats(5, 200),
    context=st.integers(128, 16384),
)
def test_a_returned_plan_meets_the_tpot_bound_and_both_roles_memory(
    case, devices, tpot_ms, context
):
    shape, name = case
    profile = measured_profile(shape) if name == "measured" else load_profile(name)
    result = plan(shape, profile, SLO(tpot_ms / 1e3), Space(devices=devices, context=context))
    usable = profile.device.usable_memory_bytes
    for choice in (result.afd, result.monolithic):
        if choice is None:
            continue
        assert choice.prediction.tpot_s <= tpot_ms / 1e3
        assert all(m.total <= usable for m in choice.prediction.memory.values())
    if result.afd is not None:
        d = result.afd.deployment
        assert isinstance(d, AFDDeployment) and d.devices == devices
        assert d.layout == "expert" or d.attention_ranks >= d.ffn_ranks
        if result.afd.batch_limit == "TPOT":  # one more sequence would break the bound
            bigger = AFDDeployment(d.layout, d.attention_ranks, d.ffn_ranks, d.batch + 1, d.stages)
            costs = LayerCosts(shape, profile)
            assert predict_afd(shape, costs, bigger, context).tpot_s > tpot_ms / 1e3
    else:
        assert result.afd_reason


def test_memory_caps_the_batch_when_the_tpot_bound_is_loose():
    result = plan(QWEN, load_profile("gb200"), SLO(1.0), Space(devices=32, context=8192))
    assert result.afd is not None and result.afd.batch_limit == "attention memory"
    assert result.binding == "attention memory"


def test_fixed_parts_of_a_deployment_are_kept():
    space = Space(
        devices=32,
        context=8192,
        layouts=("expert",),
        attention_ranks=28,
        ffn_ranks=4,
        batch=96,
        stages=(2,),
        baseline_batch=64,
        baseline_devices=4,
    )
    result = plan(QWEN, load_profile("gb200"), SLO(1.0), space)
    assert result.afd is not None and result.monolithic is not None
    assert result.afd.deployment == AFDDeployment("expert", 28, 4, 96, 2)
    assert result.afd.batch_limit == "fixed"
    assert (result.monolithic.deployment.devices, result.monolithic.deployment.batch) == (4, 64)
    assert result.ratio == pytest.approx(
        result.afd.prediction.tokens_per_s_per_device
        / result.monolithic.prediction.tokens_per_s_per_device
    )


def test_a_tpot_bound_below_one_sequence_gives_no_plan_and_says_why():
    result = plan(V3, load_profile("h100"), SLO(1e-4), Space(devices=16, context=4096))
    assert result.afd is None and "TPOT exceeded at batch" in result.afd_reason
    assert result.monolithic is None and result.ratio is None


def test_experts_that_fit_no_ffn_rank_give_no_plan():
    space = Space(devices=8, context=4096, ffn_ranks=1)
    result = plan(V3, load_profile("h100"), SLO(1.0), space)
    assert result.afd is None and "FFN memory" in result.afd_reason


def test_one_device_has_no_afd_plan_but_a_monolithic_one():
    result = plan(TINY, load_profile("cpu-core"), SLO(0.05), Space(devices=1, context=256))
    assert result.afd is None and "at least 2 devices" in result.afd_reason
    assert result.monolithic is not None and result.monolithic.deployment.stages == 1


def test_a_ttft_bound_below_the_prefill_rejects_every_deployment():
    result = plan(V3, load_profile("h100"), SLO(1.0, ttft_s=1e-4), Space(devices=16, context=8192))
    assert result.afd is None and "TTFT" in result.afd_reason


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        (Space(devices=8, context=1024, attention_ranks=6, ffn_ranks=3), "make 9 devices"),
        (Space(devices=8, context=1024, ffn_ranks=8), "FFN ranks must be in 1..7"),
        (Space(devices=8, context=1024, stages=(3,)), "stages must be 1 or 2"),
        (Space(devices=8, context=1024, layouts=("mesh",)), "layouts must be among"),
    ],
)
def test_an_impossible_space_is_an_error(space, expected):
    with pytest.raises(AFDConfigError, match=expected):
        plan(TINY, load_profile("cpu-core"), SLO(0.05), space)
