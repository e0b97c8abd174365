"""Ending a vLLM process after an AFD failure, so that vLLM notices and stops.

vLLM never polls a worker's ``check_health``; it does watch its worker processes: when
one exits, the executor shuts the engine down and the API server exits. Both role
workers use :func:`exit_worker_process` when their connector fails for good (the FFN
server's loop ended with an error; a peer of an attention rank is gone); it records the
failure for the frontend (:func:`afd_core.workers.frontend.record_failure`), so the API server
exits with a non-zero status. :func:`exit_process` is the same exit without a failure
record (a process whose API server is gone).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from afd_core.workers.frontend import flush_logs, record_failure

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds :func:`exit_process` waits for a graceful exit before ``os._exit(1)``.
EXIT_GRACE_S = 10.0


def exit_worker_process(role: str, exc: BaseException) -> None:
    """End this worker process because of ``exc`` (``role`` names it in the log line).

    Records the failure for the frontend, then :func:`exit_process`. Safe to call from
    any thread; returns at once.
    """
    record_failure(role, exc)
    exit_process(f"AFD {role}: {type(exc).__name__}: {exc}")


def exit_process(reason: str) -> None:
    """End this process: log ``reason``, send SIGTERM to itself, exit hard if still alive.

    SIGTERM is vLLM's orderly exit in its engine and worker processes; should the process
    still be alive after :data:`EXIT_GRACE_S`, it exits with status 1. Safe to call from
    any thread; returns at once.
    """
    logger.error("AFD: terminating this process (%s)", reason)
    flush_logs()
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)
