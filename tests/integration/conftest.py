"""Helpers for integration tests that run an AFD world as real processes.

``ranks`` gives a :class:`RankGroup`: start a function per rank in its own process
(forked, so torch is imported once by pytest), then ``join()`` with a hard timeout.
Each process reports its return value or the exception it raised; processes still
alive at the deadline or at teardown are killed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from afd_core.tools.launch import free_ports


@dataclass(frozen=True)
class RankOutcome:
    """How one rank process ended.

    ``error_type`` is the exception class name (None when the function returned);
    ``exitcode`` is negative when the process was killed by a signal.
    """

    name: str
    exitcode: int | None
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """The function returned normally."""
        return self.exitcode == 0 and self.error_type is None


def _child(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], delay_s: float, out: Any
) -> None:
    import torch

    torch.set_num_threads(1)
    time.sleep(delay_s)
    start = time.monotonic()
    try:
        value = fn(*args)
    except BaseException as exc:
        out.put(
            (
                name,
                None,
                type(exc).__name__,
                f"{exc}\n{traceback.format_exc()}",
                time.monotonic() - start,
            )
        )
    else:
        out.put((name, value, None, None, time.monotonic() - start))
    out.close()
    out.join_thread()
    os._exit(0)  # skip atexit handlers of the forked pytest process


class RankGroup:
    """Processes of one test; ``start`` them, then ``join`` them once.

    ``context`` is the multiprocessing context: use it for Events and Semaphores that
    the rank functions share.
    """

    def __init__(self) -> None:
        self.context = mp.get_context("fork")
        self._out = self.context.Queue()
        self._procs: dict[str, Any] = {}

    def start(self, name: str, fn: Callable[..., Any], *args: Any, delay_s: float = 0.0) -> None:
        """Run ``fn(*args)`` in a new process after ``delay_s`` seconds."""
        proc = self.context.Process(
            target=_child, args=(name, fn, args, delay_s, self._out), name=f"afd-{name}"
        )
        proc.start()
        self._procs[name] = proc

    def pid(self, name: str) -> int:
        """Process id of rank ``name``."""
        return self._procs[name].pid

    def join(self, timeout_s: float) -> dict[str, RankOutcome]:
        """Wait for every process (at most ``timeout_s`` in all); kill the stragglers.

        Fails the test when a process is still running at the deadline.
        """
        deadline = time.monotonic() + timeout_s
        reports: dict[str, tuple[Any, ...]] = {}
        while len(reports) < len(self._procs) and time.monotonic() < deadline:
            try:
                item = self._out.get(timeout=0.05)
            except queue.Empty:
                if all(not p.is_alive() for p in self._procs.values()):
                    self._drain(reports)
                    break
                continue
            reports[item[0]] = item
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        hung = [name for name, proc in self._procs.items() if proc.is_alive()]
        self.kill()
        if hung:
            pytest.fail(f"rank processes {hung} still ran after {timeout_s} s: {reports}")
        self._drain(reports)
        outcomes = {}
        for name, proc in self._procs.items():
            _, value, error_type, error, elapsed = reports.get(name, (name, None, None, None, 0))
            outcomes[name] = RankOutcome(name, proc.exitcode, value, error_type, error, elapsed)
        return outcomes

    def _drain(self, reports: dict[str, tuple[Any, ...]]) -> None:
        while True:
            try:
                item = self._out.get(timeout=0.05)
            except queue.Empty:
                return
            reports[item[0]] = item

    def kill(self) -> None:
        """Kill every process still running (idempotent)."""
        for proc in self._procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join(5)


@pytest.fixture
def ranks() -> Iterator[RankGroup]:
    """A RankGroup whose processes are killed at teardown whatever happened."""
    group = RankGroup()
    try:
        yield group
    finally:
        group.kill()


@pytest.fixture
def port() -> int:
    """A free TCP port for the rendezvous store."""
    (free,) = free_ports(1)
    return free
