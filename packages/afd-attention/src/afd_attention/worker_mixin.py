"""What every attention-role worker adds to vLLM's worker of its platform.

Mix :class:`AttentionWorkerMixin` in front of a vLLM worker class (``CPUWorker``,
``gpu_worker.Worker``) whose ``model_runner`` is an AFD attention runner
(:mod:`afd_attention.runner`):

* ``load_model`` loads the model, then opens the
  :class:`~afd_attention.session.AttentionSession` (rendezvous with FFN, step driver
  installed as the model's exchanger), bounded by the AFD timeout;
* ``shutdown`` closes the session (waking any blocked exchange) before vLLM's own
  shutdown;
* ``afd_stats`` (through ``collective_rpc``) reports the steps done and the connector
  endpoint's counters (for example the rows an expert-routed rank sent per FFN rank);
* ``profile`` (vLLM's ``/start_profile`` and ``/stop_profile``) is vLLM's, with traces
  named ``afd-attention<rank>...`` and the AFD ranges of :mod:`afd_core.workers.profiling`
  switched on while a profile runs.
"""

from __future__ import annotations

from typing import Any

from afd_attention.session import AttentionSession
from afd_core.errors import AFDError
from afd_core.workers.profiling import busy, set_ranges_enabled, trace_prefix


class AttentionWorkerMixin:
    """Opens the AFD session after the model loads and closes it at shutdown."""

    _afd_session: AttentionSession | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Load the model, then connect to FFN (bounded by the AFD timeout)."""
        from vllm.distributed import get_tensor_model_parallel_rank

        super().load_model(*args, **kwargs)  # type: ignore[misc]
        self._afd_session = AttentionSession.open(
            self.vllm_config,  # type: ignore[attr-defined]
            self.model_runner,  # type: ignore[attr-defined]
            get_tensor_model_parallel_rank(),
        )

    def afd_stats(self) -> dict[str, Any]:
        """``{"steps": completed steps, "two_stage_steps": those of two stages,
        "exchange_wait_s": seconds waited for the FFN role's results (see
        :attr:`~afd_attention.step_driver.StepDriver.exchange_wait_s`), "endpoint": the
        attention endpoint's counters}``."""
        session = self._afd_session
        if session is None:
            raise AFDError("AFD attention: not connected to the FFN role yet (model loading)")
        return {
            "steps": session.driver.completed_steps,
            "two_stage_steps": session.driver.two_stage_steps,
            "exchange_wait_s": session.driver.exchange_wait_s,
            "endpoint": session.connector.attention.stats(),
        }

    def profile(
        self, is_start: bool = True, profile_prefix: str | None = None, **kwargs: Any
    ) -> None:
        """vLLM's ``profile``, naming the trace after this attention rank and switching
        the AFD ranges on for the profile (off again when it stops)."""
        session = self._afd_session
        if is_start and session is not None:
            profile_prefix = trace_prefix("attention", session.connector.role_rank, profile_prefix)
        if is_start:
            super().profile(is_start, profile_prefix, **kwargs)  # type: ignore[misc]
            set_ranges_enabled(True)
            return
        set_ranges_enabled(False)
        # Writing the trace holds the GIL for seconds: no heartbeat could go out.
        with busy():
            super().profile(is_start, profile_prefix, **kwargs)  # type: ignore[misc]

    def shutdown(self) -> None:
        """Close the AFD connector (waking any blocked exchange), then shut down vLLM's."""
        session, self._afd_session = self._afd_session, None
        if session is not None:
            session.close()
        super().shutdown()  # type: ignore[misc]
