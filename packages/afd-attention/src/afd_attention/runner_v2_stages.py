"""Two stages per step on Model Runner V2, through vLLM's own per-micro-batch runner.

vLLM 0.32's Model Runner V2 splits a step into micro-batches with ``UBatchRunner``
(``vllm/v1/worker/gpu/ubatch_utils.py``): ``prepare`` cuts the batch at its token
midpoint and builds each micro-batch's attention metadata, slot mappings and forward
context; ``run`` runs the model once per micro-batch. vLLM builds that runner only for
dual-batch overlap with data parallelism above 1 (``maybe_build_ubatch_runner``), and
asks for micro-batches only through its data-parallel handshake (``dispatch_cg_and_sync_dp``
returns one micro-batch at DP 1). An AFD attention rank runs at DP 1, so
:func:`install_stage_runner` (called by the V2 runner mixin after vLLM's
``initialize_kv_cache``) sets both up itself, through instance attributes vLLM reads:

* each attention group gets a second metadata builder (a stage's metadata is built by
  its own builder, as vLLM's micro-batches' are), sharing the backend's workspace;
* ``runner.ubatch_runner`` becomes a :class:`StageBatchRunner`: vLLM's ``prepare``
  (its split, its per-micro-batch metadata), and a ``run`` that announces the step's two
  stages to the FFN role (:meth:`StepDriver.begin_stages`), installs each stage's AFD
  step metadata in its forward context and runs the stages on AFD's stage threads
  (:class:`~afd_attention.two_stages.TwoStageForward`: bounded waits, a failed stage
  unwinds the other, where vLLM's hand-offs wait forever);
* the graph manager's ``dispatch`` (:func:`split_eager_batches`) asks for two
  micro-batches for an eager batch of a scheduled forward that the stage policy splits
  (:meth:`TwoStageForward.splits`); graph replays, dummy and profile forwards keep one.

vLLM's cut may fall inside a request (a prefill chunk): its first tokens are then in
stage 0 and the rest in stage 1, which reads the KV cache stage 0 wrote in the same
step. Both stages therefore queue on the worker's stream, as vLLM's micro-batches do
(``"stage_streams": "shared"``; ``"per-stage"`` is refused with Model Runner V2 at
start-up, :mod:`afd_core.capabilities`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import ForwardContext, create_forward_context, get_forward_context
from vllm.v1.worker.gpu.ubatch_utils import (
    UBatchRunner,
    UBatchState,
    merge_ubatch_outputs,
    slice_model_inputs,
)

from afd_attention.stage_scheduler import NUM_STAGES
from afd_attention.step_driver import METADATA_KEY, StepDriver
from afd_attention.two_stages import TwoStageForward


class StageBatchRunner(UBatchRunner):
    """vLLM's V2 micro-batch runner whose micro-batches are AFD's two stages.

    ``driver`` announces each split step; ``stages`` runs the stages' forwards. Built at
    data-parallel size 1 with vLLM's arguments (:func:`install_stage_runner`).
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        *args: Any,
        driver: StepDriver,
        stages: TwoStageForward,
    ) -> None:
        super().__init__(_with_stage_count(vllm_config), *args)
        # Forward contexts are built from the deployment's own config.
        self.vllm_config = vllm_config
        self._driver = driver
        self._stages = stages

    def _make_forward_contexts(
        self,
        ubatch_slices: Any,
        attn_metadata: list[dict[str, Any]],
        slot_mappings_by_layer: list[dict[str, Any]],
        is_padding: list[Any],
    ) -> list[ForwardContext]:
        """One eager forward context per stage; no data-parallel metadata (DP 1)."""
        return [
            create_forward_context(
                attn_metadata[i],
                self.vllm_config,
                cudagraph_runtime_mode=CUDAGraphMode.NONE,
                slot_mapping=slot_mappings_by_layer[i],
                is_padding=is_padding[i],
            )
            for i in range(len(ubatch_slices))
        ]

    def run(self, model: Any, model_inputs: dict[str, Any], ubatch_state: UBatchState) -> Any:
        """Announce the stages, run the model once per stage (taking turns), join the outputs.

        Called by vLLM inside the step's forward context, whose ``additional_kwargs``
        each stage's context gets too.

        Raises what a stage raised, AFDError when a stage stalls
        (:meth:`TwoStageForward.run`), AFDProtocolError when the endpoint refuses the step.
        """
        slices = ubatch_state.slices
        contexts = ubatch_state.forward_contexts
        outer = get_forward_context().additional_kwargs  # the platform's, as in V1's stages
        metadata = self._driver.begin_stages([s.num_tokens for s in slices])
        for context, stage_metadata in zip(contexts, metadata, strict=True):
            context.additional_kwargs.update(outer)
            context.additional_kwargs[METADATA_KEY] = stage_metadata

        def stage_forward(inputs: dict[str, Any]) -> Callable[[], Any]:
            return lambda: model(**inputs)

        forwards = [stage_forward(slice_model_inputs(model_inputs, s.token_slice)) for s in slices]
        return merge_ubatch_outputs(self._stages.run(contexts, forwards))


def install_stage_runner(runner: Any, driver: StepDriver, stages: TwoStageForward) -> None:
    """Set up two stages per step on a Model Runner V2 ``runner`` whose KV cache is set.

    Gives each attention group a builder per stage, sets ``runner.ubatch_runner`` to a
    :class:`StageBatchRunner` and makes the graph manager ask for two micro-batches where
    :func:`split_eager_batches` says.
    """
    add_stage_metadata_builders(
        runner.attn_groups, runner.vllm_config, runner.device, runner.kernel_block_sizes
    )
    runner.ubatch_runner = StageBatchRunner(
        runner.vllm_config,
        runner.device,
        runner.model_state,
        runner.attn_groups,
        runner.kv_cache_config,
        runner.max_num_reqs,
        driver=driver,
        stages=stages,
    )
    split_eager_batches(runner.cudagraph_manager, stages, lambda: runner.afd_scheduled_forward)


def add_stage_metadata_builders(
    attn_groups: list[list[Any]],
    vllm_config: VllmConfig,
    device: Any,
    kernel_block_sizes: list[int],
) -> None:
    """Rebuild every attention group's metadata builders, one per stage, sharing the
    backend's workspace buffer as vLLM's ``init_attn_backend`` does for micro-batches."""
    workspace = None
    for group_id, groups in enumerate(attn_groups):
        block_size = kernel_block_sizes[group_id] if group_id < len(kernel_block_sizes) else None
        for group in groups:
            if len(group.metadata_builders) < NUM_STAGES:
                group.create_metadata_builders(
                    vllm_config, device, block_size, num_metadata_builders=NUM_STAGES
                )
            for builder in group.metadata_builders:
                if workspace is None:
                    if hasattr(builder, "_get_workspace_buffer"):
                        workspace = builder._get_workspace_buffer()
                elif hasattr(builder, "set_workspace_buffer"):
                    builder.set_workspace_buffer(workspace)


def split_eager_batches(
    manager: Any, stages: TwoStageForward, scheduled: Callable[[], bool]
) -> None:
    """Wrap ``manager.dispatch`` (Model Runner V2's graph manager) on the instance so that
    an eager batch of a scheduled forward (``scheduled()``) that the stage policy splits
    runs as two micro-batches. Idempotent."""
    if getattr(manager, "afd_splits_eager_batches", False):
        return
    dispatch = manager.dispatch

    def dispatch_stages(
        num_reqs: int, num_tokens: int, uniform_token_count: int | None, *args: Any, **kwargs: Any
    ) -> Any:
        desc = dispatch(num_reqs, num_tokens, uniform_token_count, *args, **kwargs)
        if desc.cg_mode != CUDAGraphMode.NONE or desc.num_ubatches != 1 or not scheduled():
            return desc
        if not stages.splits(desc.num_tokens, decode_only=uniform_token_count == 1):
            return desc
        return dataclasses.replace(desc, num_ubatches=NUM_STAGES)

    manager.dispatch = dispatch_stages
    manager.afd_splits_eager_batches = True


def _with_stage_count(vllm_config: VllmConfig) -> VllmConfig:
    """A shallow copy of ``vllm_config`` whose parallel config counts two micro-batches
    (``UBatchRunner`` sizes its per-micro-batch buffers from it); nothing else reads it."""
    parallel = copy.copy(vllm_config.parallel_config)
    parallel.ubatch_size = NUM_STAGES
    config = copy.copy(vllm_config)
    config.parallel_config = parallel
    return config
