"""Find and end the processes a launched server left, vLLM's grandchildren included.

Every server starts in a new session (``start_new_session=True``), so its session id is
its pid, and vLLM's engine-core and worker processes inherit that session even when they
are re-parented after their parent dies. On Linux the members of a session are found by
reading ``/proc/<pid>/stat`` (vLLM renames its processes, which clobbers
``/proc/<pid>/environ`` and the command line, so neither can identify them). Zombies are
ignored: they hold no resources and are reaped by their parent. Without ``/proc`` the
process group (whose id is the session id) is the only handle.

This module also remembers the sessions this process started, so a test harness can
check that nothing it launched is still running.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from afd_core.workers.procfs import read_stat

_PROC = Path("/proc")
_started_sessions: set[int] = set()


def remember_session(sid: int) -> None:
    """Record that this process started session ``sid`` (a launched server's pid)."""
    _started_sessions.add(sid)


def started_sessions() -> frozenset[int]:
    """Every session id recorded by :func:`remember_session` in this process."""
    return frozenset(_started_sessions)


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``, sorted.

    Without ``/proc``: ``[sid]`` while the process group ``sid`` exists, else ``[]``.
    """
    if not _PROC.is_dir():
        return [sid] if signal_group(sid, 0) else []
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = read_stat(entry.name)  # None: the process ended while scanning
        if stat is not None and stat.session == sid and stat.alive:
            found.append(int(entry.name))
    return sorted(found)


def kill_session(sid: int, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL process group ``sid`` and every other member of session ``sid``.

    Returns the pids that were still alive; waits up to ``timeout_s`` until none is.
    """
    pids = session_processes(sid)
    signal_group(sid, signal.SIGKILL)
    for pid in pids:
        signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group no longer exists.

    Signal 0 sends nothing and only checks that the group exists.
    """
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_pid(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid``; False when it no longer exists."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
