"""Which attention deployments may run two stages per step: the CPU runner without data
parallelism; the CUDA runners are refused at start-up, by name."""

from __future__ import annotations

import pytest

from afd_attention.hooks import check_num_stages
from afd_core.config import AFDConfig
from afd_core.errors import AFDConfigError

TWO_STAGES = AFDConfig(role="attention", connector="C", num_stages=2)


def test_two_stages_run_on_the_cpu_runner() -> None:
    check_num_stages(TWO_STAGES, "cpu")


def test_two_stages_on_cuda_are_refused_naming_the_runners() -> None:
    with pytest.raises(AFDConfigError, match=r"num_stages 2 is not supported on cuda") as info:
        check_num_stages(TWO_STAGES, "cuda")
    message = str(info.value)
    assert "AFDAttentionCUDAModelRunner on Model Runner V2" in message
    assert "AFDAttentionCUDAModelRunnerV1" in message
    assert message.endswith('set "num_stages": 1 on both roles')


def test_two_stages_with_data_parallelism_are_refused() -> None:
    with pytest.raises(AFDConfigError, match=r"data_parallel_size 2") as info:
        check_num_stages(TWO_STAGES, "cpu", data_parallel_size=2)
    assert "role_rank" in str(info.value)


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_one_stage_is_accepted_everywhere(platform: str) -> None:
    check_num_stages(AFDConfig(role="attention", connector="C"), platform, data_parallel_size=2)
