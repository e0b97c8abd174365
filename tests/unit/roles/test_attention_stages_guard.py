"""Which attention deployments may run two stages per step: vLLM's V1 runners (CPU, and
CUDA with ``VLLM_USE_V2_MODEL_RUNNER=0``), eagerly, without data parallelism, not on
Ascend NPU; the rest are refused at start-up, naming what to change. The connector's own rule is
``Connector.two_stage_problem`` (tests/unit/core/test_connector_base.py)."""

from __future__ import annotations

import pytest

from afd_attention.hooks import check_num_stages
from afd_core.config import AFDConfig
from afd_core.errors import AFDConfigError

TWO_STAGES = AFDConfig(role="attention", connector="C", num_stages=2)


def test_two_stages_run_on_the_cpu_runner() -> None:
    check_num_stages(TWO_STAGES, "cpu")


def test_two_stages_run_on_the_cuda_v1_runner_eagerly() -> None:
    check_num_stages(TWO_STAGES, "cuda", use_v2_model_runner=False, cudagraph_mode="NONE")


def test_two_stages_on_model_runner_v2_are_refused_naming_the_switch() -> None:
    with pytest.raises(AFDConfigError, match=r"num_stages 2 runs on vLLM's V1 runner") as info:
        check_num_stages(TWO_STAGES, "cuda", use_v2_model_runner=True)
    message = str(info.value)
    assert "AFDAttentionCUDAModelRunner" in message
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in message
    assert message.endswith('set "num_stages": 1 on both roles')


def test_two_stages_under_cuda_graphs_are_refused_naming_the_mode() -> None:
    with pytest.raises(AFDConfigError, match=r"cudagraph_mode FULL_DECODE_ONLY") as info:
        check_num_stages(TWO_STAGES, "cuda", cudagraph_mode="FULL_DECODE_ONLY")
    assert "--enforce-eager" in str(info.value)


def test_two_stages_with_tensor_parallelism_are_refused() -> None:
    with pytest.raises(AFDConfigError, match=r"tensor_parallel_size 2"):
        check_num_stages(TWO_STAGES, "cpu", tensor_parallel_size=2)


def test_two_stages_with_data_parallelism_are_refused() -> None:
    with pytest.raises(AFDConfigError, match=r"data_parallel_size 2") as info:
        check_num_stages(TWO_STAGES, "cpu", data_parallel_size=2)
    assert "role_rank" in str(info.value)


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_one_stage_is_accepted_everywhere(platform: str) -> None:
    check_num_stages(
        AFDConfig(role="attention", connector="C"),
        platform,
        data_parallel_size=2,
        use_v2_model_runner=True,
        cudagraph_mode="FULL",
    )


def test_two_stages_on_ascend_npu_are_refused_naming_the_padded_count() -> None:
    with pytest.raises(AFDConfigError, match=r"not built on Ascend NPU") as info:
        check_num_stages(TWO_STAGES, "npu")
    assert "num_tokens_padded" in str(info.value)
