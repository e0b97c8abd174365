"""The attention role's vLLM worker on Ascend NPU (vllm-ascend). **Hardware-unverified.**

No Ascend device, CANN toolkit or vllm-ascend for vLLM 0.32 was available to this
project: this module is checked only by a type check against committed stubs of the
vllm-ascend surface it uses (``typing/stubs``, taken from vllm-ascend ``182b75ea84``;
``tests/npu``, ``nox -s npu_checks``), never run. It imports ``vllm_ascend`` (and through it
``torch_npu``) at module level, so only the NPU worker path imports it: the plugin
registers it by its ``"module:Class"`` string.

:class:`AFDAttentionNPUWorker` is vllm-ascend's ``NPUWorker`` with

* ``init_device``: ``NPUWorker`` builds its runner inline (no ``_make_model_runner``
  seam); after it, the attention-role runner of the generation vLLM chose replaces it,
  built from the same inputs (as the CPU worker does);
* ``load_model`` and ``shutdown`` of :class:`~afd_attention.worker_mixin.AttentionWorkerMixin`.

The V1 runner's ``_model_forward`` takes the padded token count first
(``_model_forward(num_tokens_padded, input_ids, positions, intermediate_tensors,
inputs_embeds, **kwargs)``, called positionally), unlike vLLM's CUDA runner, so its
mixin (:class:`NPUAttentionRunnerMixin`) has that signature and hands
:meth:`~afd_attention.runner.AttentionRunnerCore._afd_forward` a call that passes it on.
"""

from __future__ import annotations

from typing import Any

from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
from vllm_ascend.worker.v2.model_runner import NPUModelRunner as NPUModelRunnerV2
from vllm_ascend.worker.worker import NPUWorker

from afd_attention.runner import AttentionRunnerCore, AttentionRunnerV2Mixin
from afd_attention.worker_mixin import AttentionWorkerMixin


class NPUAttentionRunnerMixin(AttentionRunnerCore):
    """Begins an AFD step for every forward of vllm-ascend's V1 runner."""

    def _model_forward(
        self,
        num_tokens_padded: int,
        input_ids: Any = None,
        positions: Any = None,
        intermediate_tensors: Any = None,
        inputs_embeds: Any = None,
        **model_kwargs: Any,
    ) -> Any:
        """Begin the step with the scheduled token count, then run vllm-ascend's forward."""
        base = super()._model_forward  # type: ignore[misc]

        def call(**kwargs: Any) -> Any:
            return base(num_tokens_padded, **kwargs)

        return self._afd_forward(
            call, input_ids, positions, intermediate_tensors, inputs_embeds, model_kwargs
        )


class AFDAttentionNPUModelRunner(NPUAttentionRunnerMixin, NPUModelRunner):
    """vllm-ascend's V1 runner with an AFD step for every forward."""


class AFDAttentionNPUModelRunnerV2(AttentionRunnerV2Mixin, NPUModelRunnerV2):
    """vllm-ascend's Model Runner V2 with every forward labelled for its AFD step."""


class AFDAttentionNPUWorker(AttentionWorkerMixin, NPUWorker):
    """vllm-ascend's worker running the attention role of an AFD deployment."""

    def init_device(self) -> None:
        """Set up the device as ``NPUWorker`` does, then use the attention-role runner."""
        super().init_device()
        runner = (
            AFDAttentionNPUModelRunnerV2 if self.use_v2_model_runner else AFDAttentionNPUModelRunner
        )
        # NPUWorker.init_device built a stock runner inline and nothing has used it yet
        # (no model, no KV cache): build ours in its place from the same inputs.
        self.model_runner = runner(self.vllm_config, self.device)
