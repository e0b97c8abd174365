"""Ending a vLLM worker process after an AFD failure, so that vLLM notices and stops.

vLLM never polls a worker's ``check_health``; it does watch its worker processes: when
one exits, the executor shuts the engine down and the API server exits with an error.
Both role workers use :func:`exit_worker_process` when their connector fails for good
(the FFN server's loop ended with an error; a peer of an attention rank is gone).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds :func:`exit_worker_process` waits for a graceful exit before ``os._exit(1)``.
EXIT_GRACE_S = 10.0


def exit_worker_process(role: str, exc: BaseException) -> None:
    """End this worker process because of ``exc`` (``role`` names it in the log line).

    Sends SIGTERM to this process (vLLM's worker handler turns it into an orderly exit)
    and, should the process still be alive after :data:`EXIT_GRACE_S`, exits hard with
    status 1. Safe to call from any thread; returns at once.
    """
    logger.error("AFD %s: terminating this worker process (%s: %s)", role, type(exc).__name__, exc)
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()
    sys.stderr.flush()
    timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)
