"""The attention role's model-runner mixins: one for vLLM's V1 runners, one for Model Runner V2.

Mix :class:`AttentionRunnerMixin` in front of a vLLM V1 runner (``GPUModelRunner`` or a
subclass such as ``CPUModelRunner``). It gives every forward of the runner an AFD step:

* ``_model_forward`` (vLLM calls it inside ``set_forward_context`` for every scheduled
  batch) begins the step with the scheduled token count before the model runs;
* ``_dummy_run`` (profile run, compile warm-up, idle data-parallel batches, graph
  capture) calls the model directly, so it only labels the forward: the exchange op
  begins the step lazily at the first layer, with these flags.

Two stages per step (``"num_stages": 2``) on the V1 runners: for a scheduled batch,
``_build_attention_metadata`` asks :class:`~afd_attention.two_stages.TwoStageForward`
where the batch splits and, when it does, builds each stage's attention metadata through
vLLM's per-micro-batch path (``ubatch_slices``, one metadata builder per stage); then
``_model_forward`` announces both stages (:meth:`StepDriver.begin_stages`), runs the model
on each stage's tokens in that stage's forward context, the stages taking turns at every
exchange, and joins the stages' hidden states in batch order before vLLM samples.

Mix :class:`AttentionRunnerV2Mixin` in front of Model Runner V2
(``vllm.v1.worker.gpu.model_runner.GPUModelRunner``, vLLM's CUDA default). That runner
opens the forward context inside ``execute_model`` right before the model runs, so no
step can begin before it; ``execute_model`` labels the forward instead (scheduled, or a
profile run) and the exchange op begins the step at the first layer with the token count
the model sees. ``capture_model`` labels the capture forwards. Two stages per step run
there through vLLM's own micro-batch runner (:mod:`afd_attention.runner_v2_stages`), set
up after vLLM's ``initialize_kv_cache``.

CUDA graphs (``FULL``/``FULL_DECODE_ONLY``): the capture forward runs the model's Python
on a capturing stream, so the exchange op begins a capture step by itself. A replay runs
no Python: the V1 mixin sees it coming in ``_model_forward`` (the forward context asks
for a ``FULL`` graph) and the V2 mixin wraps the graph manager's ``run_fullgraph``; both
announce it through :meth:`StepDriver.replay_step` before the replay is queued.

The worker assigns ``afd_driver`` once the connector is up.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from afd_attention.stage_scheduler import NUM_STAGES
from afd_attention.step_driver import (
    METADATA_KEY,
    SCHEDULED,
    ForwardDriver,
    StepDriver,
    StepFlags,
)
from afd_attention.two_stages import TwoStageForward
from afd_core.config.stages import StageSlice
from afd_core.errors import AFDError

#: Forwards of a CUDA graph capture.
CAPTURE = StepFlags(is_graph_capturing=True)
#: Model Runner V2's memory-profiling forward.
PROFILE = StepFlags(is_profile=True)


class _DriverHolder:
    #: Set by the attention worker after the model is loaded and the connector is up (a
    #: TPFollower on a tensor-parallel rank other than the leader).
    afd_driver: ForwardDriver | None = None
    #: Set with the driver when steps run two stages (``"num_stages": 2``).
    afd_stages: TwoStageForward | None = None

    def _afd_require_driver(self) -> ForwardDriver:
        driver = self.afd_driver
        if driver is None:
            raise AFDError(
                "AFD attention runner: the model ran before the AFD connector was set up; "
                "the attention worker sets it up right after load_model, and no forward may "
                "run before that"
            )
        return driver


class AttentionRunnerCore(_DriverHolder):
    """What the V1 attention runners of every platform share: the AFD step of a scheduled
    forward (:meth:`_afd_forward`), two stages per step, the labels of dummy runs.

    A platform's mixin adds ``_model_forward`` with its base runner's signature and hands
    :meth:`_afd_forward` a call of that base method: :class:`AttentionRunnerMixin` for
    vLLM's CUDA and CPU runners, the NPU mixin (``afd_attention.worker_npu``) for
    vllm-ascend's, whose ``_model_forward`` takes the padded token count first.
    """

    #: The stages :meth:`_build_attention_metadata` planned for the next forward.
    _afd_stage_plan: tuple[StageSlice, ...] | None = None

    def _afd_require_stages(self) -> TwoStageForward:
        stages = self.afd_stages
        if stages is None:
            raise AFDError("AFD attention runner: a two-stage step without the stage threads")
        return stages

    def _afd_forward(
        self,
        base: Callable[..., Any],
        input_ids: Any,
        positions: Any,
        intermediate_tensors: Any,
        inputs_embeds: Any,
        model_kwargs: dict[str, Any],
    ) -> Any:
        """Begin the step with the scheduled token count, then run the model through
        ``base`` (the platform runner's ``_model_forward``, called with keywords)."""
        tokens = input_ids if input_ids is not None else inputs_embeds
        if tokens is None:
            raise AFDError(
                "AFD attention runner: a forward without input_ids or inputs_embeds (a "
                "later pipeline stage?); the attention role runs without pipeline parallelism"
            )
        driver = self._afd_require_driver()

        def forward() -> Any:
            return base(
                input_ids=input_ids,
                positions=positions,
                intermediate_tensors=intermediate_tensors,
                inputs_embeds=inputs_embeds,
                **model_kwargs,
            )

        plan, self._afd_stage_plan = self._afd_stage_plan, None
        if self._afd_replays_full_graph():
            return driver.replay_step(tokens.shape[0], forward)
        if plan is not None:
            if intermediate_tensors is not None or model_kwargs:
                raise AFDError(
                    "AFD attention runner: a two-stage step got model inputs it cannot split "
                    f"({sorted(model_kwargs)}, intermediate tensors: "
                    f'{intermediate_tensors is not None}); set "num_stages": 1 on both roles'
                )
            return self._afd_run_stages(
                driver, base, plan, tokens.shape[0], input_ids, positions, inputs_embeds
            )
        driver.begin_step(tokens.shape[0], SCHEDULED)
        return forward()

    def _afd_run_stages(
        self,
        driver: ForwardDriver,
        base: Callable[..., Any],
        plan: tuple[StageSlice, ...],
        num_tokens: int,
        input_ids: Any,
        positions: Any,
        inputs_embeds: Any,
    ) -> Any:
        """Run the model once per stage of ``plan`` (taking turns), return the joined output.

        Called inside the forward context vLLM set for the whole batch, whose attention
        metadata is the list of the stages' (:meth:`_build_attention_metadata`). The last
        stage also takes the batch's padding tokens (``num_tokens`` past the plan's).
        """
        import torch
        from vllm.forward_context import create_forward_context, get_forward_context

        stages = self._afd_require_stages()
        outer = get_forward_context()
        bounds = [(s.token_start, s.token_stop) for s in plan]
        bounds[-1] = (bounds[-1][0], num_tokens)
        token_slices = [slice(start, stop) for start, stop in bounds]
        metadata = driver.begin_stages([stop - start for start, stop in bounds])
        contexts = [
            create_forward_context(
                outer.attn_metadata[s],
                self.vllm_config,  # type: ignore[attr-defined]
                cudagraph_runtime_mode=outer.cudagraph_runtime_mode,
                slot_mapping={name: m[part] for name, m in outer.slot_mapping.items()},
                additional_kwargs={**outer.additional_kwargs, METADATA_KEY: metadata[s]},
                skip_compiled=outer.skip_compiled,
                is_padding=None if outer.is_padding is None else outer.is_padding[part],
            )
            for s, part in enumerate(token_slices)
        ]

        def stage_forward(part: slice) -> Callable[[], Any]:
            return lambda: base(
                input_ids=None if input_ids is None else input_ids[part],
                positions=None if positions is None else positions[..., part],
                intermediate_tensors=None,
                inputs_embeds=None if inputs_embeds is None else inputs_embeds[part],
            )

        outputs = stages.run(contexts, [stage_forward(part) for part in token_slices])
        if not all(isinstance(out, torch.Tensor) for out in outputs):
            raise AFDError(
                "AFD attention runner: the model returned more than hidden states (auxiliary "
                "outputs for speculative decoding?); two-stage steps join hidden states only; "
                'set "num_stages": 1 on both roles'
            )
        return torch.cat(outputs)

    def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's attention metadata, one dict per stage for a scheduled batch that splits.

        A scheduled batch (vLLM passes its ``num_scheduled_tokens``) is planned with
        :meth:`TwoStageForward.plan`; when it splits, vLLM's per-micro-batch path builds
        the stages' metadata (``ubatch_slices``) and :meth:`_model_forward` runs the
        stages. Dummy runs and graph captures keep one stage.
        """
        build = super()._build_attention_metadata  # type: ignore[misc]
        self._afd_stage_plan = None
        stages = self.afd_stages
        if stages is None:
            return build(*args, **kwargs)
        bound = inspect.signature(build).bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        scheduled = arguments.get("num_scheduled_tokens")
        if scheduled is None or arguments["ubatch_slices"] is not None:
            return build(*args, **kwargs)
        if arguments["for_cudagraph_capture"]:
            return build(*args, **kwargs)
        requests = self.input_batch.req_ids  # type: ignore[attr-defined]
        plan = stages.plan([scheduled[r] for r in requests])
        if len(plan) == 1:
            return build(*args, **kwargs)
        from vllm.v1.worker.ubatch_utils import UBatchSlice

        arguments["ubatch_slices"] = [
            UBatchSlice(slice(s.request_start, s.request_stop), slice(s.token_start, s.token_stop))
            for s in plan
        ]
        result = build(*bound.args, **bound.kwargs)
        self._afd_stage_plan = plan
        return result

    def initialize_metadata_builders(
        self, kv_cache_config: Any, kernel_block_sizes: list[int]
    ) -> None:
        """vLLM's metadata builders, with one builder per stage when steps run two stages.

        vLLM makes one builder per attention group unless its own micro-batching is on;
        each stage's metadata is built by its own builder (a builder may keep per-batch
        buffers, such as the kernel block table).
        """
        super().initialize_metadata_builders(kv_cache_config, kernel_block_sizes)  # type: ignore[misc]
        if self.afd_stages is None:
            return
        for group_id, groups in enumerate(self.attn_groups):  # type: ignore[attr-defined]
            for attn_group in groups:
                if len(attn_group.metadata_builders) >= NUM_STAGES:
                    continue
                attn_group.create_metadata_builders(
                    self.vllm_config,  # type: ignore[attr-defined]
                    self.device,  # type: ignore[attr-defined]
                    kernel_block_sizes[group_id] if group_id < len(kernel_block_sizes) else None,
                    num_metadata_builders=NUM_STAGES,
                )

    def _afd_replays_full_graph(self) -> bool:
        """True when vLLM's forward context asks the model for a FULL graph replay."""
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context

        return get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.FULL

    def _dummy_run(self, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
        """Run vLLM's dummy forward with its purpose (profile, capture, warm-up) recorded."""
        dummy_run = super()._dummy_run  # type: ignore[misc]
        flags = dummy_run_flags(dummy_run, num_tokens, args, kwargs)
        driver = self._afd_require_driver()
        capture = driver.graph_capture() if flags.is_graph_capturing else nullcontext()
        with driver.dummy_flags(flags), capture:
            return dummy_run(num_tokens, *args, **kwargs)


class AttentionRunnerMixin(AttentionRunnerCore):
    """Begins an AFD step for every forward of a vLLM V1 model runner (CUDA, CPU)."""

    def _model_forward(
        self,
        input_ids: Any = None,
        positions: Any = None,
        intermediate_tensors: Any = None,
        inputs_embeds: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        """Begin the step with the scheduled token count, then run the model (vLLM's)."""
        base = super()._model_forward  # type: ignore[misc]
        return self._afd_forward(
            base, input_ids, positions, intermediate_tensors, inputs_embeds, model_kwargs
        )


class AttentionRunnerV2Mixin(_DriverHolder):
    """Labels every forward of vLLM's Model Runner V2 for the AFD step it begins; with
    two stages per step, runs split batches through vLLM's micro-batch runner
    (:mod:`afd_attention.runner_v2_stages`)."""

    #: True while ``execute_model`` runs a scheduled forward (only those may split).
    afd_scheduled_forward: bool = False

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's ``initialize_kv_cache``; then, with two stages per step, the stage runner."""
        super().initialize_kv_cache(*args, **kwargs)  # type: ignore[misc]
        stages = self.afd_stages
        if stages is None:
            return
        driver = self._afd_require_driver()
        if not isinstance(driver, StepDriver):
            raise AFDError(
                "AFD attention runner: two stages per step with attention tensor parallelism; "
                'set "num_stages": 1 on both roles'
            )
        from afd_attention.runner_v2_stages import install_stage_runner

        install_stage_runner(self, driver, stages)

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        """Run vLLM's ``execute_model`` with its forward labelled (see the module docstring).

        A dummy forward that is not a profile run keeps the label of its caller (graph
        capture), or none: the step driver then treats it as a warm-up.
        """
        execute_model = super().execute_model  # type: ignore[misc]
        flags = execute_model_flags(execute_model, args, kwargs)
        if flags is None:
            return execute_model(*args, **kwargs)
        self.afd_scheduled_forward = flags is SCHEDULED
        try:
            with self._afd_require_driver().dummy_flags(flags):
                return execute_model(*args, **kwargs)
        finally:
            self.afd_scheduled_forward = False

    def capture_model(self, *args: Any, **kwargs: Any) -> Any:
        """Capture vLLM's CUDA graphs with their forwards labelled as capture steps.

        First makes the graph manager announce every FULL replay (see the module
        docstring).
        """
        driver = self._afd_require_driver()
        manager = getattr(self, "cudagraph_manager", None)
        if manager is not None:
            announce_full_graph_replays(manager, driver)
        with driver.dummy_flags(CAPTURE), driver.graph_capture():
            return super().capture_model(*args, **kwargs)  # type: ignore[misc]


def announce_full_graph_replays(manager: Any, driver: StepDriver) -> None:
    """Wrap ``manager.run_fullgraph(desc)`` so every replay is a :meth:`StepDriver.replay_step`.

    ``manager`` is Model Runner V2's CUDA graph manager; ``desc.num_tokens`` is the token
    count the graph was captured with. Idempotent.
    """
    if getattr(manager, "afd_announces_replays", False):
        return
    run_fullgraph = manager.run_fullgraph

    def announced_run_fullgraph(desc: Any) -> Any:
        return driver.replay_step(desc.num_tokens, lambda: run_fullgraph(desc))

    manager.run_fullgraph = announced_run_fullgraph
    manager.afd_announces_replays = True


def dummy_run_flags(
    dummy_run: Any, num_tokens: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> StepFlags:
    """The step flags of a ``_dummy_run(num_tokens, *args, **kwargs)`` call.

    Reads ``is_profile`` and ``is_graph_capturing`` however they were passed (by position
    or keyword); a dummy run that is neither is a warm-up (compile warm-up or an idle
    data-parallel batch).
    """
    bound = inspect.signature(dummy_run).bind(num_tokens, *args, **kwargs)
    bound.apply_defaults()
    is_profile = bool(bound.arguments.get("is_profile", False))
    is_capturing = bool(bound.arguments.get("is_graph_capturing", False))
    return StepFlags(
        is_warmup=not (is_profile or is_capturing),
        is_graph_capturing=is_capturing,
        is_profile=is_profile,
    )


def execute_model_flags(
    execute_model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> StepFlags | None:
    """The step flags of a Model Runner V2 ``execute_model(*args, **kwargs)`` call.

    A scheduled forward (``dummy_run`` false) is :data:`SCHEDULED`, a profile run
    :data:`PROFILE`; any other dummy forward returns None (its caller's label applies).
    """
    bound = inspect.signature(execute_model).bind(*args, **kwargs)
    bound.apply_defaults()
    if not bound.arguments.get("dummy_run", False):
        return SCHEDULED
    if bound.arguments.get("is_profile", False):
        return PROFILE
    return None
