"""Two stages on Model Runner V2: when a batch splits, how a split step runs, and the vLLM
seams the stage runner uses.

Building the stage runner needs a CUDA device (vLLM's ``UBatchRunner`` makes CUDA
streams); a served deployment runs in ``tests/e2e_gpu/test_afd_cuda_exactness.py`` (the
``runner-v2`` two-stage cases). Here, on CPU: the dispatch rule against vLLM's own
descriptor type; the request-boundary cut of a real V2 input batch through vLLM's own
slicing; ``StageBatchRunner.run`` with vLLM's forward contexts and micro-batch
slices on the real stage threads (a fake step driver and model); the stage count on a
copy of vLLM's config; and the signatures of the vLLM 0.32 methods it overrides or
wraps, so that a vLLM change fails here.
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
from vllm.v1.worker.ubatch_utils import maybe_create_ubatch_slices

from afd_attention.runner_v2_stages import (
    StageBatchRunner,
    request_cut_slices,
    split_eager_batches,
)
from afd_attention.two_stages import TwoStageForward
from afd_core.config.stages import StagePolicy

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
    ("num_reqs", "num_tokens", "uniform", "expected"),
    [
        (8, 8, 1, 2),  # decodes at the decode threshold
        (7, 7, 1, 1),  # decodes below it
        (4, 31, None, 1),  # a batch with a prefill below the prefill threshold
        (4, 32, None, 2),  # at it
        (4, 16, 4, 1),  # four tokens each is not a batch of decodes: the prefill threshold
        (1, 64, None, 1),  # one request: no request boundary to cut at
    ],
)
def test_an_eager_scheduled_batch_splits_at_the_policys_thresholds(
    stages: TwoStageForward, num_reqs: int, num_tokens: int, uniform: int | None, expected: int
) -> None:
    desc = wrapped(stages).dispatch(num_reqs, num_tokens, uniform, 0)
    assert desc.num_ubatches == expected
    assert desc.cg_mode == CUDAGraphMode.NONE and desc.num_tokens == num_tokens


def dummy_batch(num_reqs: int, num_tokens: int) -> Any:
    """vLLM's own V2 input batch of ``num_reqs`` requests (its dummy: tokens spread evenly,
    the remainder on the last requests), on the CPU."""
    import torch
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    buffers = InputBuffers(max_num_reqs=16, max_num_tokens=256, device=torch.device("cpu"))
    return InputBatch.make_dummy(num_reqs, num_tokens, buffers, is_padding=False)


def test_a_v2_batch_is_cut_at_the_request_boundary_nearest_its_token_midpoint(
    stages: TwoStageForward,
) -> None:
    import torch
    from vllm.v1.worker.gpu.ubatch_utils import _slice_input_batch

    batch = dummy_batch(3, 40)  # 13, 13, 14 tokens: vLLM's midpoint (20) is inside request 1
    assert batch.num_scheduled_tokens.tolist() == [13, 13, 14]
    slices = request_cut_slices(batch, stages)
    assert [(s.request_slice, s.token_slice) for s in slices] == [
        (slice(0, 2), slice(0, 26)),
        (slice(2, 3), slice(26, 40)),
    ]
    # vLLM's own slicing of each stage: every request keeps all its tokens and its length.
    for stage, s in enumerate(slices):
        sub = _slice_input_batch(
            batch, s, torch.zeros(17, dtype=torch.int32), torch.zeros(16, dtype=torch.int32)
        )
        assert (
            sub.num_scheduled_tokens.tolist()
            == batch.num_scheduled_tokens[s.request_slice].tolist()
        ), stage
        assert sub.seq_lens.tolist() == batch.seq_lens[s.request_slice].tolist(), stage


def test_a_batch_the_policy_does_not_cut_is_refused_as_a_bug(stages: TwoStageForward) -> None:
    from afd_core.errors import AFDError

    with pytest.raises(AFDError, match="does not cut"):
        request_cut_slices(dummy_batch(1, 40), stages)


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
    assert params(UBatchRunner.prepare) == params(StageBatchRunner.prepare)
    # StageBatchRunner.prepare builds a stage as vLLM's prepare builds a micro-batch.
    source = inspect.getsource(UBatchRunner.prepare)
    calls = (
        "create_ubatch_slices(",
        "_slice_input_batch(",
        "model_state.prepare_attn(",
        "ubatch_idx=i",
        "build_slot_mappings_by_layer(",
        "self._make_forward_contexts(",
    )
    for call in calls:
        assert call in source, call
    assert "split_point" in params(maybe_create_ubatch_slices)
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


def test_the_stage_runner_counts_two_micro_batches_on_a_copy_of_the_config() -> None:
    from vllm.config import VllmConfig
    from vllm.v1.worker.ubatch_utils import get_num_ubatches

    from afd_attention.runner_v2_stages import _with_stage_count

    config = VllmConfig()
    staged = _with_stage_count(config)
    assert get_num_ubatches(staged.parallel_config) == 2
    assert get_num_ubatches(config.parallel_config) == 1  # the deployment's is untouched
    assert config.parallel_config.ubatch_size == 0


class FakeDriver:
    """``StepDriver.begin_stages`` in miniature: records the sizes, returns one label each."""

    def __init__(self) -> None:
        self.announced: list[list[int]] = []

    def begin_stages(self, sizes: list[int]) -> tuple[str, ...]:
        self.announced.append(list(sizes))
        return tuple(f"step-stage-{s}" for s in range(len(sizes)))


def test_run_announces_the_cut_and_runs_each_stage_on_its_tokens_in_its_context(
    stages: TwoStageForward,
) -> None:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import (
        create_forward_context,
        get_forward_context,
        override_forward_context,
    )
    from vllm.v1.worker.gpu.ubatch_utils import UBatchState
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    from afd_attention.step_driver import METADATA_KEY

    config = VllmConfig()
    # vLLM's UBatchRunner.__init__ makes CUDA streams; run() needs none of its state.
    runner = object.__new__(StageBatchRunner)
    runner._driver, runner._stages = FakeDriver(), stages
    state = UBatchState(
        slices=[UBatchSlice(slice(0, 2), slice(0, 3)), UBatchSlice(slice(1, 3), slice(3, 5))],
        forward_contexts=[create_forward_context(None, config) for _ in range(2)],
    )
    seen: list[tuple[list[int], dict[str, Any]]] = []

    def model(input_ids: Any, positions: Any, inputs_embeds: Any, intermediate_tensors: Any):
        for _ in range(2):  # two layers: hand over after each
            seen.append((input_ids.tolist(), dict(get_forward_context().additional_kwargs)))
            stages.checkpoint()
        return input_ids.float() * 10

    inputs = {"input_ids": torch.arange(5), "positions": torch.arange(5),
              "inputs_embeds": None, "intermediate_tensors": None}  # fmt: skip
    outer = create_forward_context(None, config, additional_kwargs={"platform": 1})
    with override_forward_context(outer):
        output = runner.run(model, inputs, state)
    assert runner._driver.announced == [[3, 2]]
    assert output.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert [ids for ids, _ in seen] == [[0, 1, 2], [3, 4], [0, 1, 2], [3, 4]]
    for ids, kwargs in seen:
        stage = 0 if ids[0] == 0 else 1
        assert kwargs == {"platform": 1, METADATA_KEY: f"step-stage-{stage}"}
