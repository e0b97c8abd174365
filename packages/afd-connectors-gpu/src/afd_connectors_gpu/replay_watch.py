"""``ReplayWatch`` and ``CudaReplayGuard``: bound CUDA graph replays the host does not wait for.

The attention runner queues a graph replay and goes on; the replay's NCCL transfers wait
on the device for the FFN rank. Should the FFN rank stop answering, nothing on the host
would notice. A ReplayWatch keeps the completion events of the replays queued so far and
a daemon thread polls the oldest one: once a replay is still running ``timeout_s`` after
it was queued, ``on_timeout(step_id)`` runs (once) on that thread; the connector fails
and aborts its transfers there, which ends the replay.

The thread makes no CUDA call while nothing is pending or while it is paused
(:meth:`ReplayWatch.pause`, around graph captures: vLLM captures in CUDA's global mode,
which forbids event queries from any thread). Events only need ``query()``.

:class:`CudaReplayGuard` is what the connectors hold (afd-core's
:class:`~afd_core.dataplane.replay_guard.ReplayGuard`): it records the events and drives a
ReplayWatch.
Importing this module imports no torch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


class CudaReplayGuard:
    """afd-core's ``ReplayGuard`` on CUDA events: bounds the replays of one connector.

    ``on_overrun(what)`` runs once a replay (or a stream wait) overruns ``timeout_s``:
    the connector fails its fuse and interrupts its transport there, which ends the
    pending transfers, so the stuck device work finishes and the next call raises.
    ``name`` names the watch thread.
    """

    def __init__(self, timeout_s: float, on_overrun: Callable[[str], None], name: str) -> None:
        import torch

        self._torch = torch
        self._timeout_s = timeout_s
        self._on_overrun = on_overrun
        self._name = name
        self._watch: ReplayWatch | None = None
        self._overrun = threading.Event()

    def watch(self, step_id: int) -> None:
        """Bound the replay of ``step_id`` just queued on the current stream."""
        torch = self._torch
        if self._watch is None:
            self._watch = ReplayWatch(self._timeout_s, self._replay_overran, self._name)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        self._watch.add(step_id, event)

    def drain(self, before: str) -> None:
        """Wait until every watched replay finished (bounded); report an overrun."""
        watch = self._watch
        if watch is None or not watch.pending():
            return
        deadline = time.monotonic() + self._timeout_s
        if not watch.drain(deadline, self._overrun.is_set):
            self._overrun_once(f"the CUDA graph replays before {before}")

    @contextmanager
    def capturing(self) -> Iterator[None]:
        """Drain, then make no CUDA call from the watch thread until the capture ends."""
        watch = self._watch
        if watch is None:
            yield
            return
        self.drain("a CUDA graph capture")
        watch.pause()
        try:
            yield
        finally:
            watch.resume()

    def wait_for_stream(self, what: str) -> None:
        """Wait (bounded) until the current stream's queued work is done."""
        torch = self._torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        deadline = time.monotonic() + self._timeout_s
        while not event.query():
            if self._overrun.is_set():
                break
            if time.monotonic() >= deadline:
                self._overrun_once(what)
                break
            time.sleep(0)

    def stop(self) -> None:
        """End the watch thread (idempotent)."""
        if self._watch is not None:
            self._watch.stop()

    def _replay_overran(self, step_id: int) -> None:
        self._overrun_once(f"the CUDA graph replay of step {step_id}")

    def _overrun_once(self, what: str) -> None:
        if not self._overrun.is_set():
            self._overrun.set()
            self._on_overrun(what)
