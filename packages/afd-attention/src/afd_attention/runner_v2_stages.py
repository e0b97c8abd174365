"""Two stages per step on Model Runner V2, through vLLM's own per-micro-batch runner.

vLLM 0.32's Model Runner V2 splits a step into micro-batches with ``UBatchRunner``
(``vllm/v1/worker/gpu/ubatch_utils.py``): ``prepare`` cuts the batch and builds each
micro-batch's input batch, attention metadata, slot mappings and forward context; ``run``
runs the model once per micro-batch. vLLM builds that runner only for dual-batch overlap
with data parallelism above 1 (``maybe_build_ubatch_runner``), and asks for micro-batches
only through its data-parallel handshake (``dispatch_cg_and_sync_dp`` returns one
micro-batch at DP 1). An AFD attention rank runs at DP 1, so :func:`install_stage_runner`
(called by the V2 runner mixin after vLLM's ``initialize_kv_cache``) sets both up itself,
through instance attributes vLLM reads:

* each attention group gets a second metadata builder (a stage's metadata is built by
  its own builder, as vLLM's micro-batches' are), sharing the backend's workspace;
* ``runner.ubatch_runner`` becomes a :class:`StageBatchRunner`. Its ``prepare`` cuts the
  batch where the V1 runners' stages are cut, at the request boundary
  :func:`afd_core.config.stages.plan_request_split` picks (vLLM's own cuts at the token
  midpoint, through a request if need be), and builds each stage as vLLM's ``prepare``
  builds a micro-batch. Its ``run`` announces the step's two stages to the FFN role
  (:meth:`StepDriver.begin_stages`), installs each stage's AFD step metadata in its
  forward context and runs the stages on AFD's stage threads
  (:class:`~afd_attention.two_stages.TwoStageForward`: bounded waits, a failed stage
  unwinds the other, where vLLM's hand-offs wait forever);
* the graph manager's ``dispatch`` (:func:`split_eager_batches`) asks for two
  micro-batches for an eager batch of a scheduled forward that the stage policy cuts
  (:meth:`StagePolicy.splits_at_request`); graph replays, dummy and profile forwards keep
  one.

Because no request is in both stages, neither stage reads KV cache the other writes in
the same step, and the stages may queue on streams of their own
(``"stage_streams": "per-stage"``) as on the V1 runner.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import ForwardContext, create_forward_context, get_forward_context
from vllm.v1.worker.gpu.attn_utils import build_slot_mappings_by_layer
from vllm.v1.worker.gpu.ubatch_utils import (
    UBatchRunner,
    UBatchState,
    _slice_input_batch,
    merge_ubatch_outputs,
    slice_model_inputs,
)
from vllm.v1.worker.ubatch_utils import UBatchSlice, maybe_create_ubatch_slices

from afd_attention.stage_scheduler import NUM_STAGES
from afd_attention.step_driver import METADATA_KEY, StepDriver
from afd_attention.two_stages import TwoStageForward
from afd_core.errors import AFDError


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

    def prepare(
        self,
        input_batch: Any,
        block_tables: tuple[Any, ...],
        slot_mappings: Any,
        cg_mode: CUDAGraphMode = CUDAGraphMode.NONE,
        for_capture: bool = False,
    ) -> UBatchState:
        """vLLM's ``UBatchRunner.prepare`` with the stages cut at a request boundary.

        Each stage's input batch, attention metadata (its own builder), slot mappings and
        forward context are built as vLLM builds a micro-batch's; only the cut differs
        (:func:`request_cut_slices`). Raises AFDError when the stage policy does not cut
        this batch (the dispatch rule and the planner disagree: a bug).
        """
        slices = request_cut_slices(input_batch, self._stages)
        attn_metadata = []
        slot_mappings_by_layer = []
        is_padding = []
        for i, stage in enumerate(slices):
            stage_batch = _slice_input_batch(
                input_batch,
                stage,
                self.ubatch_query_start_loc[i],
                self.ubatch_seq_lens[i],
                self.ubatch_dcp_local_seq_lens[i],
                dcp_size=self.dcp_size,
                dcp_rank=self.dcp_rank,
                cp_interleave=self.cp_interleave,
            )
            stage_slot_mappings = slot_mappings[:, stage.token_slice]
            attn_metadata.append(
                self.model_state.prepare_attn(
                    stage_batch,
                    cg_mode,
                    tuple(table[stage.request_slice] for table in block_tables),
                    stage_slot_mappings,
                    self.attn_groups,
                    self.kv_cache_config,
                    ubatch_idx=i,
                    for_capture=for_capture,
                )
            )
            slot_mappings_by_layer.append(
                build_slot_mappings_by_layer(stage_slot_mappings, self.kv_cache_config)
            )
            is_padding.append(stage_batch.is_padding)
        return UBatchState(
            slices=slices,
            forward_contexts=self._make_forward_contexts(
                slices, attn_metadata, slot_mappings_by_layer, is_padding
            ),
        )

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


def request_cut_slices(input_batch: Any, stages: TwoStageForward) -> list[UBatchSlice]:
    """The two micro-batch slices of a Model Runner V2 ``input_batch``, cut at the request
    boundary ``stages`` plans; the second extends over the batch's padding, as vLLM's do.

    Raises AFDError when the plan is one stage.
    """
    num_reqs = input_batch.num_reqs
    tokens = input_batch.num_scheduled_tokens[:num_reqs]
    plan = stages.plan([int(n) for n in tokens])
    if len(plan) != NUM_STAGES:
        raise AFDError(
            f"AFD attention: Model Runner V2 asked for {NUM_STAGES} stages of a batch of "
            f"{num_reqs} requests and {int(tokens.sum())} tokens that the stage policy "
            f"does not cut ({stages.policy}); this is a bug in afd-attention, please report it"
        )
    _, padded = maybe_create_ubatch_slices(
        True,
        tokens,
        input_batch.num_tokens_after_padding,
        input_batch.num_reqs_after_padding,
        NUM_STAGES,
        split_point=plan[0].token_stop,
    )
    assert padded is not None
    return list(padded)


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
    an eager batch of a scheduled forward (``scheduled()``) that the stage policy cuts at
    a request boundary runs as two micro-batches. Idempotent."""
    if getattr(manager, "afd_splits_eager_batches", False):
        return
    dispatch = manager.dispatch

    def dispatch_stages(
        num_reqs: int, num_tokens: int, uniform_token_count: int | None, *args: Any, **kwargs: Any
    ) -> Any:
        desc = dispatch(num_reqs, num_tokens, uniform_token_count, *args, **kwargs)
        if desc.cg_mode != CUDAGraphMode.NONE or desc.num_ubatches != 1 or not scheduled():
            return desc
        decode_only = uniform_token_count == 1
        if not stages.policy.splits_at_request(num_reqs, num_tokens, decode_only=decode_only):
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
