"""The FFN role's vLLM worker on Ascend NPU (vllm-ascend). **Hardware-unverified.**

Checked only by the type check against the committed stubs (``tests/npu``, ``nox -s npu_checks``),
never run: no Ascend device, CANN toolkit or vllm-ascend for vLLM 0.32 was available to
this project. It imports ``vllm_ascend`` at module level; only the NPU worker path
imports it (the plugin registers it by its ``"module:Class"`` string).

:class:`AFDFFNNPUWorker` is vllm-ascend's ``NPUWorker`` turned into a host for the FFN
server, like the CPU and CUDA workers (:class:`~afd_ffn.worker_mixin.FFNWorkerMixin`:
no KV cache, the server thread started instead of the warm-up, requests refused, the
connector closed before the thread is joined), with one addition: vllm-ascend chooses a
MoE layer's communication (MC2, all-to-all, all-gather) and its token mask from the
token count of the forward context, so each received batch is computed in an Ascend
forward context of its own size (``afd_batch_context``), not one per step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from vllm_ascend.ascend_forward_context import set_ascend_forward_context
from vllm_ascend.worker.worker import NPUWorker

from afd_ffn.worker_mixin import FFNWorkerMixin


class AFDFFNNPUWorker(FFNWorkerMixin, NPUWorker):
    """vllm-ascend's worker running the FFN role of an AFD deployment."""

    def afd_batch_context(self, rows: int) -> AbstractContextManager[Any]:
        """An Ascend forward context sized for a received batch of ``rows`` rows."""
        return set_ascend_forward_context(None, self.vllm_config, num_tokens=rows)
