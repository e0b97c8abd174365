"""A stop signal taken by another thread reaches a main thread blocked in a ZMQ poll.

``afd_core.workers.startup_signals``.

Real processes (``python -c``) and a real pyzmq poll, no vLLM: the main thread installs a
SIGTERM handler that raises ``KeyboardInterrupt`` (what vLLM's API server does for its
start-up) and polls a socket that never gets a message, for :data:`POLL_S`. A helper thread sends
SIGTERM to itself (``signal.pthread_kill``), so the interpreter's handler runs on that
thread and the main thread's poll is not interrupted: what the kernel did to vLLM's API
server when it handed a SIGTERM to a native thread of that process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

#: How long the main thread polls; the process must end long before.
POLL_S = 8
#: Bound for the relayed signal to end the process (the relay waits RELAY_AFTER_S).
END_BOUND_S = 5.0

PROGRAM = f"""
import signal, socket, sys, threading, zmq
from afd_core.workers.startup_signals import relay_startup_signals

RELAY = sys.argv[1] == "relay"

def interrupt(*_):
    raise KeyboardInterrupt("terminated")

signal.signal(signal.SIGTERM, interrupt)
loop_side, loop_wakeup = socket.socketpair()  # an event loop's wakeup socket
loop_wakeup.setblocking(False)
signal.set_wakeup_fd(loop_wakeup.fileno())
if RELAY:
    assert relay_startup_signals()

def signal_this_thread():
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

context = zmq.Context()
sock = context.socket(zmq.PULL)
sock.bind("tcp://127.0.0.1:*")
threading.Timer(0.5, signal_this_thread).start()
try:
    sock.poll(timeout={POLL_S * 1000})
    print("poll returned")
except KeyboardInterrupt:
    loop_side.settimeout(5)
    print("interrupted; the event loop saw signal", loop_side.recv(1)[0])
"""


def run(mode: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        timeout=POLL_S + 30,
    )
    return result, time.monotonic() - started


def test_a_signal_taken_by_another_thread_interrupts_the_main_threads_poll() -> None:
    result, took = run("relay")
    assert result.returncode == 0, result.stderr
    expected = f"interrupted; the event loop saw signal {int(signal.SIGTERM)}"
    assert expected in result.stdout, result.stdout
    assert took < END_BOUND_S, f"took {took:.1f} s"


def test_without_the_relay_the_poll_goes_on_until_its_timeout() -> None:
    """The case the relay exists for: the same program, no relay, waits out its poll."""
    result, took = run("plain")
    assert result.returncode == 0, result.stderr
    assert took >= POLL_S, f"the poll ended after {took:.1f} s: {result.stdout}"
