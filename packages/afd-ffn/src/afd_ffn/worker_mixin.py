"""What every FFN-role worker adds to vLLM's worker of its platform.

Mix :class:`FFNWorkerMixin` in front of a vLLM worker class (``CPUWorker``,
``gpu_worker.Worker``) to turn it into a host for the :class:`~afd_ffn.server.FFNServer`:

* no KV cache (``get_kv_cache_spec`` is empty; AFD turns prefix caching off for this
  role, which vLLM needs for a cache without groups);
* ``compile_or_warm_up_model``, vLLM's last startup call, runs no forward (there is no
  scheduler-driven forward on this role) and starts the FFN server thread on the
  worker's device, so the API server becomes healthy while the thread waits for the
  attention ranks;
* ``execute_model``, ``sample_tokens`` and ``execute_dummy_batch`` refuse: requests
  belong to the attention role's server;
* ``afd_stats`` (through ``collective_rpc``) reports the server's counters,
  ``afd_status`` its readiness (``GET /afd/status``, :mod:`afd_core.http_status`) and
  ``check_health`` re-raises its failure;
* ``profile`` (vLLM's ``/start_profile`` and ``/stop_profile``) profiles the server
  thread with :class:`~afd_core.workers.all_threads_profiler.AllThreadsProfiler`
  (iterations are FFN steps),
  traces named ``afd-ffn<rank>...``.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NoReturn

from vllm.distributed import get_tensor_model_parallel_rank
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.worker_base import CompilationTimes

from afd_core.errors import AFDError
from afd_core.workers.all_threads_profiler import worker_profiler
from afd_core.workers.profiling import trace_prefix
from afd_ffn.server import FFNServer, open_ffn_server

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds ``shutdown`` waits for the server thread after closing the connector.
STOP_TIMEOUT_S = 5.0


class FFNWorkerMixin:
    """Runs the FFN server in a vLLM worker instead of scheduler-driven forwards."""

    _afd_server: FFNServer | None = None

    def get_kv_cache_spec(self) -> dict[str, Any]:
        """No KV cache: the FFN role runs no attention."""
        return {}

    def determine_available_memory(self) -> int:
        """No KV cache memory (vLLM skips this call for an empty KV cache spec)."""
        return 0

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Start the FFN server instead of warming up (nothing here runs a full forward)."""
        set_random_seed(self.model_config.seed)  # type: ignore[attr-defined]
        if self._afd_server is None:
            self._afd_server = open_ffn_server(
                self.vllm_config,  # type: ignore[attr-defined]
                self.model_runner.get_model(),  # type: ignore[attr-defined]
                get_tensor_model_parallel_rank(),
                device=self.device,  # type: ignore[attr-defined]
                on_step=self._profiler_step,
                batch_context=self.afd_batch_context,
            )
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def afd_batch_context(self, rows: int) -> AbstractContextManager[Any]:
        """The context each received batch of ``rows`` rows is computed in, inside the
        step's (platform hook; default: nothing)."""
        return nullcontext()

    def execute_model(self, scheduler_output: Any) -> NoReturn:
        """Refuse: the FFN role serves no requests."""
        _refuse_requests()

    def sample_tokens(self, grammar_output: Any) -> NoReturn:
        """Refuse: the FFN role serves no requests."""
        _refuse_requests()

    def execute_dummy_batch(self) -> NoReturn:
        """Refuse: the FFN role serves no requests."""
        _refuse_requests()

    def profile(
        self, is_start: bool = True, profile_prefix: str | None = None, **kwargs: Any
    ) -> None:
        """vLLM's ``profile``, over the FFN server thread (see
        :mod:`afd_core.workers.all_threads_profiler`).

        Only vLLM's ``torch`` profiler is supported on this role (checked at start-up).
        """
        server = self._afd_server
        if is_start and server is not None:
            self.profiler = worker_profiler(
                self.profiler,  # type: ignore[has-type]
                self.profiler_config,  # type: ignore[attr-defined]
                trace_prefix("ffn", server.role_rank),
                self.device,  # type: ignore[attr-defined]
            )
            profile_prefix = trace_prefix("ffn", server.role_rank, profile_prefix)
        super().profile(is_start, profile_prefix, **kwargs)  # type: ignore[misc]

    def _profiler_step(self) -> None:
        profiler = self.profiler  # type: ignore[has-type]
        if profiler is not None:
            profiler.step()

    def check_health(self) -> None:
        """Raise the FFN server's failure, if it failed."""
        server = self._afd_server
        if server is not None and server.error is not None:
            raise AFDError(f"AFD FFN server failed: {server.error}") from server.error

    def afd_status(self) -> dict[str, Any]:
        """This FFN rank's readiness (:meth:`FFNServer.status <afd_ffn.server.FFNServer.status>`;
        before the server starts: not ready, ``state`` ``"loading the model"``). Served over
        HTTP by :class:`afd_core.http_status.AFDStatusMiddleware`."""
        server = self._afd_server
        if server is None:
            return {"role": "ffn", "ready": False, "state": "loading the model"}
        return server.status()

    def afd_stats(self) -> dict[str, Any]:
        """The FFN server's counters (:class:`~afd_ffn.stats.FFNStats`), once connected its
        endpoint's (``"endpoint"``: e.g. the expert block and rows per layer) and, for an
        expert-routed model, the experts its weights hold (``"loaded_experts"``)."""
        server = self._afd_server
        if server is None:
            raise AFDError("AFD FFN: the FFN server has not started yet (model still loading)")
        stats = server.stats.as_dict() | {"endpoint": server.endpoint_stats()}
        loaded = getattr(server.model, "afd_loaded_experts", None)
        if callable(loaded) and (experts := loaded()) is not None:
            stats["loaded_experts"] = experts
        return stats

    def shutdown(self) -> None:
        """Stop the FFN server (bounded), then shut down vLLM's worker."""
        server, self._afd_server = self._afd_server, None
        if server is not None and not server.stop(STOP_TIMEOUT_S):
            logger.warning(
                "AFD FFN: the server thread did not stop within %.0f s; shutting down anyway "
                "(it is a daemon thread and ends with the process)",
                STOP_TIMEOUT_S,
            )
        super().shutdown()  # type: ignore[misc]


def _refuse_requests() -> NoReturn:
    raise AFDError(
        "AFD: this server runs the FFN role of an AFD deployment and does not serve "
        "requests; send requests to the attention role's server"
    )
