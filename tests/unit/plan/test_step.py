"""One deployment's decode step: the layer time with m stages is the published bound
max(t_attn + t_ffn + t_comm, m x max(t_attn, t_ffn)) (with the link as a third
resource), two stages never beat perfect overlap, and TPOT never falls as the batch grows."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_core.plan.costs import Cost, LayerCosts
from afd_core.plan.model_shape import load_model_shape, model_shape_from_config
from afd_core.plan.profile import load_profile
from afd_core.plan.step import (
    LAYOUTS,
    AFDDeployment,
    LayerTime,
    MonolithicDeployment,
    predict_afd,
    predict_monolithic,
)
from afd_core.plan.tables import Curve
from tests.unit.plan.conftest import MODELS, measured_profile, tiny_config

SHAPES = [
    model_shape_from_config(tiny_config("tiny-qwen3-moe")),
    model_shape_from_config(tiny_config("tiny-deepseek-v2")),
    load_model_shape(MODELS / "deepseek-v3"),
    load_model_shape(MODELS / "qwen3-235b-a22b-fp8"),
]
ROOFLINES = ["h100", "h200", "gb200", "ascend-910b", "cpu-core"]

deployments = st.builds(
    lambda layout, a, f, b, m: AFDDeployment(
        layout, max(a, f) if layout == "p2p" else a, f, max(b, m), m
    ),
    st.sampled_from(LAYOUTS),
    st.integers(1, 64),
    st.integers(1, 32),
    st.integers(1, 512),
    st.sampled_from([1, 2]),
)


def test_one_stage_is_the_serial_chain_and_two_stages_the_published_bound():
    attn, ffn, comm = Cost(3.0, "compute"), Cost(2.0, "compute"), Cost(1.0, "exchange")
    assert LayerTime(attn, ffn, comm, 0.5, 1, colocated=False).seconds == 6.0
    assert LayerTime(attn, ffn, comm, 0.5, 2, colocated=False).seconds == 6.0  # chain binds
    assert LayerTime(attn, ffn, Cost(0.5, "x"), 0.1, 2, colocated=False).seconds == 6.0
    assert LayerTime(attn, ffn, Cost(0.1, "x"), 0.1, 3, colocated=False).seconds == 9.0
    assert LayerTime(attn, ffn, Cost(0.1, "x"), 4.0, 2, colocated=False).bound == "link"


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    profile=st.sampled_from(ROOFLINES),
    plan=deployments,
    context=st.integers(1, 32768),
)
def test_a_layer_never_beats_its_bound_and_two_stages_never_beat_perfect_overlap(
    shape, profile, plan, context
):
    costs = LayerCosts(shape, load_profile(profile))
    layer = predict_afd(shape, costs, plan, context).sparse_layer
    chain = layer.attention.seconds + layer.ffn.seconds + layer.exchange.seconds
    busiest = max(layer.attention.seconds, layer.ffn.seconds, layer.link_s)
    assert layer.seconds == pytest.approx(max(chain, plan.stages * busiest))
    one = AFDDeployment(plan.layout, plan.attention_ranks, plan.ffn_ranks, plan.batch, 1)
    whole = predict_afd(shape, costs, one, context).sparse_layer
    # every stage's work has to be done by the same devices: perfect overlap at best
    assert layer.seconds >= max(whole.attention.seconds, whole.ffn.seconds) * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    profile=st.sampled_from([*ROOFLINES, "measured"]),
    plan=deployments,
    more=st.integers(1, 256),
    context=st.integers(1, 32768),
)
def test_tpot_never_falls_as_the_batch_grows(shape, profile, plan, more, context):
    hw = measured_profile(shape) if profile == "measured" else load_profile(profile)
    costs = LayerCosts(shape, hw)
    bigger = AFDDeployment(
        plan.layout, plan.attention_ranks, plan.ffn_ranks, plan.batch + more, plan.stages
    )
    assert (
        predict_afd(shape, costs, bigger, context).tpot_s
        >= predict_afd(shape, costs, plan, context).tpot_s
    )
    mono = MonolithicDeployment(plan.devices, plan.batch, plan.stages)
    mono_bigger = MonolithicDeployment(plan.devices, plan.batch + more, plan.stages)
    assert (
        predict_monolithic(shape, costs, mono_bigger, context).tpot_s
        >= predict_monolithic(shape, costs, mono, context).tpot_s
    )


def test_throughput_counts_every_attention_ranks_sequences_over_all_devices():
    shape = SHAPES[2]
    costs = LayerCosts(shape, load_profile("h200"))
    p = predict_afd(shape, costs, AFDDeployment("expert", 6, 2, 64, 2), 4096)
    assert p.tokens_per_s_per_device == pytest.approx(6 * 64 / p.tpot_s / 8)
    assert p.memory["FFN rank"].weights == pytest.approx(
        shape.moe_layers * math.ceil(256 / 2) * shape.expert_params * shape.weight_bytes
    )
    assert p.memory["FFN rank"].kv_cache == 0


def test_the_expert_routed_layout_keeps_dense_layers_on_attention_without_an_exchange():
    shape = SHAPES[1]  # tiny DeepSeek: dense first layer
    costs = LayerCosts(shape, load_profile("cpu-core"))
    p = predict_afd(shape, costs, AFDDeployment("expert", 2, 1, 8, 1), 64)
    assert p.dense_layer is not None and p.dense_layer.exchange.seconds == 0
    p2p = predict_afd(shape, costs, AFDDeployment("p2p", 2, 1, 8, 1), 64)
    assert p2p.dense_layer is not None and p2p.dense_layer.exchange.seconds > 0


def _with_serving(profile, seconds_at_1, seconds_at_64):
    tables = dataclasses.replace(
        profile.measured,
        serving_overhead=Curve.through((1, 64), (seconds_at_1, seconds_at_64)),
    )
    return dataclasses.replace(profile, measured=tables)


@pytest.mark.parametrize("stages", [1, 2])
def test_the_serving_overhead_is_added_once_per_step_whatever_the_stages(stages):
    shape = model_shape_from_config(tiny_config("tiny-qwen3-moe"))
    plain = measured_profile(shape)
    served = _with_serving(plain, 1e-3, 8e-3)
    plan = AFDDeployment("p2p", 1, 1, 16, stages)
    without = predict_afd(shape, LayerCosts(shape, plain), plan, 64)
    with_it = predict_afd(shape, LayerCosts(shape, served), plan, 64)
    charged = 1e-3 + 7e-3 * 15 / 63
    assert with_it.tpot_s - without.tpot_s == pytest.approx(charged)
    assert with_it.outside_layers_s - without.outside_layers_s == pytest.approx(charged)
    assert with_it.sparse_layer == without.sparse_layer


def test_the_monolithic_step_pays_the_serving_overhead_too():
    shape = model_shape_from_config(tiny_config("tiny-qwen3-moe"))
    plain = measured_profile(shape)
    served = _with_serving(plain, 2e-3, 2e-3)
    plan = MonolithicDeployment(1, 16, 1)
    without = predict_monolithic(shape, LayerCosts(shape, plain), plan, 64)
    with_it = predict_monolithic(shape, LayerCosts(shape, served), plan, 64)
    assert with_it.tpot_s - without.tpot_s == pytest.approx(2e-3)


def test_a_roofline_profile_charges_no_serving_overhead():
    shape = model_shape_from_config(tiny_config("tiny-qwen3-moe"))
    assert LayerCosts(shape, load_profile("cpu-core")).serving(16).seconds == 0.0
