"""The life cycle every part of a connector shares, and the one shutdown order.

A part (a world or link with its transports, an op provider's groups, a control
receiver thread, a step relay, a link acceptor, the rendezvous session) has three
steps, each idempotent and never raising:

* ``interrupt``: wake every wait on it and refuse new work (fast, from any thread);
* ``join``: end its threads (bounded);
* ``release``: free what it holds (process groups, sockets, the store).

:class:`Parts` keeps them in the order they were built. Taking them down interrupts
every part, then joins every part, then releases every part, the last built first in
each round: no thread is joined while another part could still block it, and nothing
is released under a thread that may still use it. The assembler uses it both for the
connector's ``close()`` and to undo a half-finished build.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(f"vllm.{__name__}")


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Part:
    """One part's three steps (each defaults to nothing) and its name, for the log."""

    name: str
    interrupt: Callable[[], None] = _nothing
    join: Callable[[], None] = _nothing
    release: Callable[[], None] = _nothing


class Parts:
    """The parts of one connector, in the order they were built."""

    def __init__(self) -> None:
        self._parts: list[Part] = []

    def add(self, part: Part) -> None:
        """Take ``part`` down with the others (see the module docstring)."""
        self._parts.append(part)

    def take_down(self) -> None:
        """Interrupt, join, then release every part, the last built first (idempotent)."""
        parts, self._parts = self._parts[::-1], []
        for step in ("interrupt", "join", "release"):
            for part in parts:
                try:
                    getattr(part, step)()
                except Exception:  # a step must not raise; log and go on with the others
                    logger.exception("AFD: %s of %s failed", step, part.name)
