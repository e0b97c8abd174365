"""The one check of a config and an attention deployment against a connector's class:
its pattern (async DP, gate placement) and its capabilities (CUDA graphs, two stages,
attention TP), and the attention role's own limits on two stages (vLLM's V1 runners,
eagerly, without data or tensor parallelism, not on Ascend NPU). Every refusal names
what to change."""

from __future__ import annotations

from typing import Any

import pytest

from afd_core.assembly import ExpertRouted, P2pBlock
from afd_core.capabilities import AttentionDeployment, Capabilities, check_connector
from afd_core.config import AFDConfig
from afd_core.connector import Connector
from afd_core.errors import AFDConfigError
from tests.unit.core.fake_connectors import InBandPattern


class Eager(Connector):
    name = "Eager"
    pattern_type = P2pBlock


class Graphs(Connector):
    name = "Graphs"
    pattern_type = P2pBlock
    capabilities = Capabilities(cuda_graphs=True)


class OneStage(Connector):
    name = "OneStage"
    pattern_type = P2pBlock
    capabilities = Capabilities(two_stages=False, attention_tp=False)


class Routed(Connector):
    name = "Routed"
    pattern_type = ExpertRouted


class InBand(Connector):
    name = "InBand"
    pattern_type = InBandPattern


def config(**changes: Any) -> AFDConfig:
    return AFDConfig(role="attention", connector="C", **changes)


TWO = config(num_stages=2)


def cuda(**changes: Any) -> AttentionDeployment:
    return AttentionDeployment("cuda", **changes)


def refused(connector: type[Connector], cfg: AFDConfig, deployment: Any = None) -> str:
    with pytest.raises(AFDConfigError) as info:
        check_connector(cfg, connector, deployment)
    return str(info.value)


# The pattern: async DP and the gate ------------------------------------------------------


def test_async_dp_needs_a_pattern_without_announced_steps() -> None:
    assert "remove async_dp" in refused(Eager, config(async_dp=True))
    assert 'set "async_dp": true' in refused(InBand, config())
    check_connector(config(async_dp=True), InBand)


def test_a_pattern_that_routes_experts_needs_the_gate_on_attention() -> None:
    message = refused(Routed, config())
    assert "router runs on the attention role" in message
    assert '"compute_gate_on_attention": true' in message
    check_connector(config(compute_gate_on_attention=True), Routed)
    check_connector(config(compute_gate_on_attention=True), Eager)


# Capabilities -----------------------------------------------------------------------------


def test_two_stages_need_the_capability() -> None:
    message = refused(OneStage, TWO)
    assert "num_stages 2 with OneStage" in message
    assert message.endswith("use a connector that carries two stages")
    check_connector(TWO, Eager)


def test_attention_tp_needs_the_capability() -> None:
    message = refused(OneStage, config(), AttentionDeployment("cpu", tensor_parallel_size=2))
    assert "tensor_parallel_size 2" in message
    check_connector(config(), Eager, AttentionDeployment("cpu", tensor_parallel_size=2))


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_DECODE_ONLY"])
def test_a_captured_mode_needs_a_connector_that_runs_in_graphs(mode: str) -> None:
    message = refused(Eager, config(), cuda(cudagraph_mode=mode))
    assert mode in message and "--enforce-eager" in message


def test_eager_forwards_accept_any_connector() -> None:
    check_connector(config(), Eager, cuda())
    check_connector(config(), Eager, AttentionDeployment("cpu"))


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL"])
def test_whole_forward_graphs_run_with_a_graph_connector(mode: str) -> None:
    check_connector(config(), Graphs, cuda(cudagraph_mode=mode))


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
def test_piecewise_graphs_are_refused_even_with_a_graph_connector(mode: str) -> None:
    message = refused(Graphs, config(), cuda(cudagraph_mode=mode))
    assert "captures pieces of the forward" in message and "FULL_DECODE_ONLY" in message


@pytest.mark.parametrize("size", ["data_parallel_size", "tensor_parallel_size"])
def test_graphs_with_parallel_attention_are_refused(size: str) -> None:
    message = refused(Graphs, config(), cuda(cudagraph_mode="FULL_DECODE_ONLY", **{size: 2}))
    assert f"{size} 2 are not supported" in message and "--enforce-eager" in message
    check_connector(config(), Graphs, cuda(**{size: 2}))


# The attention role's limits on two stages ----------------------------------------------------


def test_two_stages_run_on_the_cpu_runner_and_both_cuda_runners_eagerly() -> None:
    check_connector(TWO, Eager, AttentionDeployment("cpu"))
    check_connector(TWO, Eager, cuda())
    check_connector(TWO, Eager, cuda(use_v2_model_runner=True))
    check_connector(config(num_stages=2, stage_streams="per-stage"), Eager, cuda())
    per_stage_v2 = cuda(use_v2_model_runner=True)
    check_connector(config(num_stages=2, stage_streams="per-stage"), Eager, per_stage_v2)


def test_two_stages_of_an_mla_model_on_model_runner_v2_are_refused_naming_the_v1_runner() -> None:
    message = refused(Eager, TWO, cuda(use_v2_model_runner=True, uses_mla=True))
    assert "not supported for MLA models" in message and "VLLM_USE_V2_MODEL_RUNNER=0" in message
    check_connector(TWO, Eager, cuda(uses_mla=True))  # the V1 runner
    check_connector(config(), Eager, cuda(use_v2_model_runner=True, uses_mla=True))  # one stage


def test_two_stages_under_cuda_graphs_are_refused_before_the_graph_rules() -> None:
    message = refused(Graphs, TWO, cuda(cudagraph_mode="FULL_DECODE_ONLY"))
    assert "runs eagerly" in message and "cudagraph_mode FULL_DECODE_ONLY" in message
    assert "--enforce-eager" in message


@pytest.mark.parametrize("size", ["tensor_parallel_size", "data_parallel_size"])
def test_two_stages_with_parallel_attention_are_refused(size: str) -> None:
    message = refused(Eager, TWO, AttentionDeployment("cpu", **{size: 2}))
    assert f"{size} 2" in message


def test_two_stages_on_ascend_npu_are_refused_naming_the_padded_count() -> None:
    message = refused(Eager, TWO, AttentionDeployment("npu"))
    assert "not built on Ascend NPU" in message and "num_tokens_padded" in message


def test_one_stage_is_accepted_everywhere() -> None:
    for deployment in (
        AttentionDeployment("cpu", data_parallel_size=2),
        cuda(data_parallel_size=2, use_v2_model_runner=True),
        AttentionDeployment("npu"),
    ):
        check_connector(config(), Eager, deployment)
