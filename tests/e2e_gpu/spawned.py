"""Rank processes of the CUDA connector tests: spawned (CUDA cannot be forked), each
reporting its value or its error, all killed at the end of the test."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

JOIN_TIMEOUT_S = 180.0


def _child(name: str, fn: Callable[..., Any], args: tuple[Any, ...], out: Any) -> None:
    try:
        out.put((name, True, fn(*args)))
    except BaseException as exc:
        out.put((name, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Ranks:
    """Spawned rank processes of one test; ``join`` returns each one's value."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._out = self._ctx.Queue()
        self._procs: dict[str, Any] = {}

    def start(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        proc = self._ctx.Process(target=_child, args=(name, fn, args, self._out), daemon=True)
        proc.start()
        self._procs[name] = proc

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        results: dict[str, Any] = {}
        while len(results) < len(self._procs) and time.monotonic() < deadline:
            try:
                name, ok, value = self._out.get(timeout=0.5)
            except queue.Empty:
                dead = [n for n, p in self._procs.items() if not p.is_alive() and n not in results]
                if dead:
                    pytest.fail(f"rank processes {dead} died without a result (see output above)")
                continue
            if not ok:
                pytest.fail(f"rank {name} raised: {value}")
            results[name] = value
        if len(results) < len(self._procs):
            pytest.fail(f"ranks {sorted(set(self._procs) - set(results))} hung for {timeout_s} s")
        return results

    def kill(self) -> None:
        for proc in self._procs.values():
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


@pytest.fixture
def ranks() -> Iterator[Ranks]:
    group = Ranks()
    try:
        yield group
    finally:
        group.kill()


@pytest.fixture
def port() -> int:
    from afd_core.tools.launch import free_ports

    (free,) = free_ports(1)
    return free
