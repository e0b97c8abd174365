"""A stop signal reaches an API server that waits for its engine to start.

vLLM's API server installs a SIGTERM handler for its start-up (it raises
``KeyboardInterrupt``) and then waits for its engine's "ready" in a ZMQ poll of up to
``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s by default). An AFD attention server waits there
for as long as its rendezvous with the FFN role takes. Python runs a signal handler in
the main thread only, when the main thread is interrupted; when the kernel hands the
signal to another thread of the process (measured: a native thread that runs no Python), the
poll goes on and the signal is acted on only when the wait ends (``docs/failures.md``).

:func:`relay_startup_signals` (called once in the API server's main thread, before the
engine starts) makes the signal reach the main thread in every case. It puts a pipe of
its own in place of the process's signal wakeup fd (``signal.set_wakeup_fd``; the
interpreter writes the number of every signal it receives there, whichever thread took
it) and starts a thread that reads the pipe:

* every byte is passed on to the wakeup fd that was installed before (the event loop's),
  so the event loop sees every signal as it did;
* after a SIGTERM or SIGINT, once :data:`RELAY_AFTER_S` have passed, if the main thread
  is still blocked in a ZMQ poll (its innermost Python frame is ``zmq.sugar.poll``'s
  ``poll``), the thread sends the same signal to the main thread
  (``signal.pthread_kill``): the poll is interrupted and vLLM's handler runs. A main
  thread that took the signal itself has left the poll by then (the handler raises at
  once), so the signal is never acted on twice. Each signal is relayed once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds a SIGTERM/SIGINT is given to reach the main thread before it is relayed.
RELAY_AFTER_S = 0.5
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
_POLL_MODULE = "zmq.sugar.poll"


def relay_startup_signals() -> bool:
    """Install the relay described in the module docstring; False (and nothing done)
    when not called from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    main = threading.main_thread().ident
    assert main is not None
    threading.Thread(
        target=_relay, args=(read_fd, previous, main), name="afd-startup-signals", daemon=True
    ).start()
    return True


def main_thread_in_zmq_poll(main: int) -> bool:
    """Whether the thread ``main`` is blocked in pyzmq's poll (its innermost frame)."""
    frame = sys._current_frames().get(main)
    return (
        frame is not None
        and frame.f_code.co_name == "poll"
        and frame.f_globals.get("__name__") == _POLL_MODULE
    )


def _relay(read_fd: int, previous: int, main: int) -> None:
    relayed: set[int] = set()
    while True:
        try:
            received = os.read(read_fd, 512)
        except OSError:
            return
        if not received:
            return
        if previous != -1:
            with contextlib.suppress(OSError):  # a full or closed event-loop pipe
                os.write(previous, received)
        for number in received:
            if number not in _STOP_SIGNALS or number in relayed:
                continue
            time.sleep(RELAY_AFTER_S)
            if main_thread_in_zmq_poll(main):
                relayed.add(number)
                logger.info(
                    "AFD: %s arrived while the engine starts; passing it to the main thread",
                    signal.Signals(number).name,
                )
                signal.pthread_kill(main, number)
