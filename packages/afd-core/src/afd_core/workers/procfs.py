"""What ``/proc/<pid>/stat`` says about a process (Linux), parsed in one place.

The command name (field 2) is in parentheses and may itself hold spaces and
parentheses, so the fields after it are found from the last ``)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` AFD reads: command name, state letter (``"Z"``:
    zombie), parent pid and session id."""

    comm: str
    state: str
    ppid: int
    session: int

    @property
    def alive(self) -> bool:
        """Not a zombie or a dead task."""
        return self.state not in ("Z", "X")


def read_stat(pid: int | str) -> ProcStat | None:
    """The :class:`ProcStat` of ``pid``, or None when it is gone (or there is no /proc)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    state, ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
    return ProcStat(comm, state, int(ppid), int(session))
