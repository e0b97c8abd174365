"""Per-layer costs: more work never takes less time, the wire is latency plus bytes over
bandwidth, and measured tables are used only for the model they were measured on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_core.errors import AFDConfigError
from afd_core.plan.costs import LayerCosts
from afd_core.plan.model_shape import load_model_shape, model_shape_from_config
from afd_core.plan.profile import load_profile, preset_names
from tests.unit.plan.conftest import MODELS, measured_profile, tiny_config

SHAPES = {
    "tiny-qwen3-moe": model_shape_from_config(tiny_config("tiny-qwen3-moe")),
    "tiny-deepseek-v2": model_shape_from_config(tiny_config("tiny-deepseek-v2")),
    "deepseek-v3": load_model_shape(MODELS / "deepseek-v3"),
    "qwen3-235b": load_model_shape(MODELS / "qwen3-235b-a22b-fp8"),
}


def _costs(shape_name: str, profile_name: str) -> LayerCosts:
    shape = SHAPES[shape_name]
    profile = measured_profile(shape) if profile_name == "measured" else load_profile(profile_name)
    return LayerCosts(shape, profile)


costs_cases = st.tuples(
    st.sampled_from(sorted(SHAPES)), st.sampled_from([*preset_names(), "measured"])
)


@settings(max_examples=200, deadline=None)
@given(
    case=costs_cases,
    batch=st.integers(1, 4096),
    context=st.integers(1, 131072),
    more=st.integers(1, 512),
)
def test_more_batch_or_context_never_lowers_the_attention_time(case, batch, context, more):
    costs = _costs(*case)
    base = costs.attention(batch, context).seconds
    assert costs.attention(batch + more, context).seconds >= base
    if costs.measured is None:  # measured tables are monotone in the batch only
        assert costs.attention(batch, context + more).seconds >= base


@settings(max_examples=200, deadline=None)
@given(
    case=costs_cases,
    tokens=st.integers(1, 100_000),
    more=st.integers(1, 4096),
    held=st.integers(1, 256),
)
def test_more_tokens_never_lower_the_ffn_time(case, tokens, more, held):
    costs = _costs(*case)
    held = min(held, costs.shape.num_experts)
    assert costs.experts(tokens + more, held).seconds >= costs.experts(tokens, held).seconds
    assert costs.shared(tokens + more).seconds >= costs.shared(tokens).seconds
    assert costs.dense(tokens + more).seconds >= costs.dense(tokens).seconds
    assert costs.outside_layers(tokens + more).seconds >= costs.outside_layers(tokens).seconds


def test_an_exchange_is_a_round_trip_of_latency_plus_bytes_over_bandwidth():
    costs = _costs("deepseek-v3", "h100")
    link = load_profile("h100").link
    assert costs.transfer(1e6).seconds == pytest.approx(
        2 * (link.latency_s + 1e6 / link.bytes_per_s)
    )
    assert costs.transfer(0).seconds == 0


def test_small_decode_batches_are_bound_by_memory_bandwidth_on_a_gpu():
    costs = _costs("deepseek-v3", "h200")
    assert costs.experts(8, 32).limiter == "memory bandwidth"
    assert costs.attention(1, 4096).limiter == "memory bandwidth"


def test_a_measured_profile_of_another_model_is_refused():
    profile = measured_profile(SHAPES["tiny-qwen3-moe"])
    with pytest.raises(AFDConfigError, match="measured on another model"):
        LayerCosts(SHAPES["tiny-deepseek-v2"], profile)
