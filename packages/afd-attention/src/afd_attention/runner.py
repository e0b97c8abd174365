"""The attention role's V1 model-runner mixin (CPU now, CUDA's V1 runner later).

Mix :class:`AttentionRunnerMixin` in front of a vLLM V1 runner (``GPUModelRunner`` or a
subclass such as ``CPUModelRunner``). It gives every forward of the runner an AFD step:

* ``_model_forward`` (vLLM calls it inside ``set_forward_context`` for every scheduled
  batch) begins the step with the scheduled token count before the model runs;
* ``_dummy_run`` (profile run, compile warm-up, idle data-parallel batches, graph
  capture) calls the model directly, so it only labels the forward: the exchange op
  begins the step lazily at the first layer, with these flags.

The worker assigns :attr:`AttentionRunnerMixin.afd_driver` once the connector is up.
"""

from __future__ import annotations

import inspect
from typing import Any

from afd_attention.step_driver import SCHEDULED, StepDriver, StepFlags
from afd_core.errors import AFDError


class AttentionRunnerMixin:
    """Begins an AFD step for every forward of a vLLM V1 model runner."""

    #: Set by the attention worker after the model is loaded and the connector is up.
    afd_driver: StepDriver | None = None

    def _model_forward(
        self,
        input_ids: Any = None,
        positions: Any = None,
        intermediate_tensors: Any = None,
        inputs_embeds: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        """Begin the step with the scheduled token count, then run the model (vLLM's)."""
        tokens = input_ids if input_ids is not None else inputs_embeds
        if tokens is None:
            raise AFDError(
                "AFD attention runner: a forward without input_ids or inputs_embeds (a "
                "later pipeline stage?); the attention role runs without pipeline parallelism"
            )
        self._afd_require_driver().begin_step(tokens.shape[0], SCHEDULED)
        return super()._model_forward(  # type: ignore[misc]
            input_ids=input_ids,
            positions=positions,
            intermediate_tensors=intermediate_tensors,
            inputs_embeds=inputs_embeds,
            **model_kwargs,
        )

    def _dummy_run(self, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
        """Run vLLM's dummy forward with its purpose (profile, capture, warm-up) recorded."""
        dummy_run = super()._dummy_run  # type: ignore[misc]
        flags = dummy_run_flags(dummy_run, num_tokens, args, kwargs)
        with self._afd_require_driver().dummy_flags(flags):
            return dummy_run(num_tokens, *args, **kwargs)

    def _afd_require_driver(self) -> StepDriver:
        driver = self.afd_driver
        if driver is None:
            raise AFDError(
                "AFD attention runner: the model ran before the AFD connector was set up; "
                "the attention worker sets it up right after load_model, and no forward may "
                "run before that"
            )
        return driver


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
