"""Two stages on Model Runner V2: when a batch splits, and the vLLM seams the stage runner uses.

The stage runner itself needs a CUDA device (vLLM's ``UBatchRunner`` makes CUDA streams);
it runs in ``tests/e2e_gpu/test_afd_cuda_exactness.py`` (the ``runner-v2`` two-stage
cases). Here: the dispatch rule against vLLM's own descriptor type, and the signatures
of the vLLM 0.32 methods it overrides or wraps, so that a vLLM change fails here.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.config import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import (
    BatchExecutionDescriptor,
    ModelCudaGraphManager,
)
from vllm.v1.worker.gpu.model_runner import GPUModelRunner
from vllm.v1.worker.gpu.ubatch_utils import UBatchRunner

from afd_attention.runner_v2_stages import StageBatchRunner, split_eager_batches
from afd_attention.two_stages import TwoStageForward
from afd_core.stages import StagePolicy

POLICY = StagePolicy(decode_token_threshold=8, prefill_token_threshold=32)


class FakeManager:
    """Model Runner V2's graph manager in miniature: ``dispatch`` answers ``mode``."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.NONE) -> None:
        self.mode = mode
        self.calls = 0

    def dispatch(self, num_reqs, num_tokens, uniform_token_count, num_active_loras,
                 max_query_len=None, num_ubatches=1):  # fmt: skip
        self.calls += 1
        return BatchExecutionDescriptor(
            cg_mode=self.mode,
            num_tokens=num_tokens,
            num_reqs=num_reqs,
            uniform_token_count=uniform_token_count,
            num_ubatches=num_ubatches,
        )


@pytest.fixture
def stages() -> Any:
    forward = TwoStageForward(POLICY, timeout_s=5.0)
    yield forward
    forward.close()


def wrapped(stages: TwoStageForward, scheduled: bool = True, **kwargs: Any) -> FakeManager:
    manager = FakeManager(**kwargs)
    split_eager_batches(manager, stages, lambda: scheduled)
    return manager


@pytest.mark.parametrize(
    ("num_tokens", "uniform", "expected"),
    [
        (8, 1, 2),  # decodes at the decode threshold
        (7, 1, 1),  # decodes below it
        (31, None, 1),  # a batch with a prefill below the prefill threshold
        (32, None, 2),  # at it
        (16, 4, 1),  # four tokens each is not a batch of decodes: the prefill threshold
    ],
)
def test_an_eager_scheduled_batch_splits_at_the_policys_thresholds(
    stages: TwoStageForward, num_tokens: int, uniform: int | None, expected: int
) -> None:
    desc = wrapped(stages).dispatch(4, num_tokens, uniform, 0)
    assert desc.num_ubatches == expected
    assert desc.cg_mode == CUDAGraphMode.NONE and desc.num_tokens == num_tokens


def test_graph_replays_and_unscheduled_forwards_keep_one_micro_batch(
    stages: TwoStageForward,
) -> None:
    assert wrapped(stages, mode=CUDAGraphMode.FULL).dispatch(64, 64, 1, 0).num_ubatches == 1
    assert wrapped(stages, scheduled=False).dispatch(64, 64, 1, 0).num_ubatches == 1


def test_the_dispatch_wrap_is_installed_once(stages: TwoStageForward) -> None:
    manager = wrapped(stages)
    split_eager_batches(manager, stages, lambda: True)
    manager.dispatch(4, 64, None, 0)
    assert manager.calls == 1


def test_vllms_seams_have_the_signatures_the_stage_runner_uses() -> None:
    def params(function: Any) -> list[str]:
        return list(inspect.signature(function).parameters)

    assert params(UBatchRunner.__init__) == [
        "self", "vllm_config", "device", "model_state", "attn_groups", "kv_cache_config",
        "max_num_reqs",
    ]  # fmt: skip
    assert params(UBatchRunner.run) == params(StageBatchRunner.run)
    assert params(UBatchRunner._make_forward_contexts) == params(
        StageBatchRunner._make_forward_contexts
    )
    assert params(ModelCudaGraphManager.dispatch)[:4] == [
        "self", "num_reqs", "num_tokens", "uniform_token_count",
    ]  # fmt: skip
    assert "num_ubatches" in params(ModelCudaGraphManager.dispatch)
    assert "num_ubatches" in BatchExecutionDescriptor.__dataclass_fields__
    assert params(GPUModelRunner.initialize_kv_cache)[:2] == ["self", "kv_cache_config"]
    # The attributes install_stage_runner reads are set by vLLM's initialize_kv_cache.
    source = inspect.getsource(GPUModelRunner.initialize_kv_cache)
    for attribute in ("self.attn_groups", "self.kernel_block_sizes", "self.cudagraph_manager",
                      "self.ubatch_runner"):  # fmt: skip
        assert attribute in source, attribute
