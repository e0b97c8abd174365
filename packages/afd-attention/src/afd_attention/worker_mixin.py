"""What every attention-role worker adds to vLLM's worker of its platform.

Mix :class:`AttentionWorkerMixin` in front of a vLLM worker class (``CPUWorker``,
``gpu_worker.Worker``) whose ``model_runner`` is an AFD attention runner
(:mod:`afd_attention.runner`):

* ``load_model`` loads the model, then opens the
  :class:`~afd_attention.session.AttentionSession` (rendezvous with FFN, step driver
  installed as the model's exchanger), bounded by the AFD timeout;
* ``shutdown`` closes the session (waking any blocked exchange) before vLLM's own
  shutdown;
* ``afd_status`` (``GET /afd/status``, :mod:`afd_core.http_status`) says whether the
  session is open;
* ``afd_stats`` (through ``collective_rpc``) reports the steps done and the connector
  endpoint's counters (for example the rows an expert-routed rank sent per FFN rank);
* ``profile`` (vLLM's ``/start_profile`` and ``/stop_profile``) is vLLM's, with traces
  named ``afd-attention<rank>...``; vLLM's ``torch`` profiler is replaced by
  :class:`~afd_core.workers.all_threads_profiler.AllThreadsProfiler`, which also records
  the ranges of the stage threads of two-stage steps and switches the AFD ranges of
  :mod:`afd_core.workers.profiling` on while it runs.
"""

from __future__ import annotations

from typing import Any

from afd_attention.session import AttentionSession, TPFollowerSession, open_session
from afd_core.errors import AFDError
from afd_core.workers.all_threads_profiler import worker_profiler
from afd_core.workers.profiling import trace_prefix


class AttentionWorkerMixin:
    """Opens the AFD session after the model loads and closes it at shutdown."""

    _afd_session: AttentionSession | TPFollowerSession | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Load the model, then connect to FFN (bounded by the AFD timeout; TP rank 0
        only: the other TP ranks take its results, :mod:`afd_attention.tensor_parallel`)."""
        from vllm.distributed import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        super().load_model(*args, **kwargs)  # type: ignore[misc]
        self._afd_session = open_session(
            self.vllm_config,  # type: ignore[attr-defined]
            self.model_runner,  # type: ignore[attr-defined]
            get_tensor_model_parallel_rank(),
            get_tensor_model_parallel_world_size(),
        )

    def afd_stats(self) -> dict[str, Any]:
        """The session's counters: on the attention rank (TP rank 0) the steps, two-stage
        steps, seconds waited for FFN results and the endpoint's counters
        (:meth:`AttentionSession.stats`); on another TP rank its rank and the exchanges
        it took from the leader (:meth:`TPFollowerSession.stats`)."""
        session = self._afd_session
        if session is None:
            raise AFDError("AFD attention: not connected to the FFN role yet (model loading)")
        return session.stats()

    def afd_status(self) -> dict[str, Any]:
        """This attention rank's readiness: ``ready`` once its AFD session is open (the
        rendezvous with the FFN role done), ``state`` ``"connecting to the FFN role"``
        before. Served over HTTP by :class:`afd_core.http_status.AFDStatusMiddleware`."""
        session = self._afd_session
        if session is None:
            return {"role": "attention", "ready": False, "state": "connecting to the FFN role"}
        return {
            "role": "attention",
            "attention_rank": session.role_rank,
            "ready": True,
            "state": "serving",
        }

    def profile(
        self, is_start: bool = True, profile_prefix: str | None = None, **kwargs: Any
    ) -> None:
        """vLLM's ``profile``, naming the trace after this attention rank; with vLLM's
        ``torch`` profiler every thread is recorded
        (:func:`~afd_core.workers.all_threads_profiler.worker_profiler`; vLLM's worker
        steps it once per engine step, as it would its own)."""
        session = self._afd_session
        if is_start and session is not None:
            self.profiler = worker_profiler(
                self.profiler,  # type: ignore[has-type]
                self.profiler_config,  # type: ignore[attr-defined]
                trace_prefix("attention", session.role_rank),
                self.device,  # type: ignore[attr-defined]
            )
            profile_prefix = trace_prefix("attention", session.role_rank, profile_prefix)
        super().profile(is_start, profile_prefix, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        """Close the AFD connector (waking any blocked exchange), then shut down vLLM's."""
        session, self._afd_session = self._afd_session, None
        if session is not None:
            session.close()
        super().shutdown()  # type: ignore[misc]
