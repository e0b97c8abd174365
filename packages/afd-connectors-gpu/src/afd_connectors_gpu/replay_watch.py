"""``ReplayWatch``: bounds CUDA graph replays that the host does not wait for.

The attention runner queues a graph replay and goes on; the replay's NCCL transfers wait
on the device for the FFN rank. Should the FFN rank stop answering, nothing on the host
would notice. A ReplayWatch keeps the completion events of the replays queued so far and
a daemon thread polls the oldest one: once a replay is still running ``timeout_s`` after
it was queued, ``on_timeout(step_id)`` runs (once) on that thread; the connector fails
and aborts its transfers there, which ends the replay.

The thread makes no CUDA call while nothing is pending or while it is paused
(:meth:`ReplayWatch.pause`, around graph captures: vLLM captures in CUDA's global mode,
which forbids event queries from any thread). Events only need ``query()``; torch is not
imported here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: Seconds between two polls of the oldest pending replay.
POLL_S = 0.002


class ReplayWatch:
    """Watches queued replays; ``on_timeout(step_id)`` runs once the first one overruns."""

    def __init__(self, timeout_s: float, on_timeout: Callable[[int], None], name: str) -> None:
        self._timeout_s = timeout_s
        self._on_timeout = on_timeout
        self._pending: deque[tuple[int, Any, float]] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._paused = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, step_id: int, event: Any) -> None:
        """Watch the replay of ``step_id``, done once ``event.query()`` is true."""
        with self._cond:
            self._pending.append((step_id, event, time.monotonic() + self._timeout_s))
            self._cond.notify()

    def pending(self) -> int:
        """Replays queued and not yet seen complete."""
        with self._cond:
            return len(self._pending)

    def drain(self, deadline: float, stop: Callable[[], bool]) -> bool:
        """Wait until every watched replay is complete; False at ``deadline`` or ``stop()``."""
        while True:
            with self._cond:
                while self._pending and self._pending[0][1].query():
                    self._pending.popleft()
                if not self._pending:
                    return True
            if stop() or time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)

    def pause(self) -> None:
        """Stop polling (until :meth:`resume`); returns once no poll is in progress."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        """Poll again after :meth:`pause`."""
        with self._cond:
            self._paused = False
            self._cond.notify()

    def stop(self, join_timeout_s: float = 2.0) -> None:
        """End the thread (idempotent); pending replays are no longer watched."""
        with self._cond:
            self._stopped = True
            self._pending.clear()
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while (not self._pending or self._paused) and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                step_id, event, deadline = self._pending[0]
                if event.query():
                    self._pending.popleft()
                    continue
                if time.monotonic() >= deadline:
                    self._pending.clear()
                    self._stopped = True
                    overrun: int | None = step_id
                else:
                    overrun = None
            if overrun is not None:
                self._on_timeout(overrun)
                return
            time.sleep(POLL_S)
