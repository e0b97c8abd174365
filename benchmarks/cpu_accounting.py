"""CPU time and run-queue waits of server process trees over a timed window (Linux).

For every thread of every process in the given sessions (a launched server's pid is its
session id), the kernel keeps, in ``/proc/<pid>/task/<tid>/schedstat``, the time the thread
ran on a CPU and the time it was runnable but waited for one (its run delay). A window
is two :func:`snapshot` calls around the timed work; :func:`window` turns them into
:class:`WindowTimes`: CPU and run delay per process kind (server name and ``comm``, e.g.
``ffn-0:VLLM::EngineCor``), and how busy the host's CPUs were overall
(``/proc/stat``). ``benchmarks/afd_decode.py --cpu-accounting`` uses it to show whether a
deployment is CPU-bound on the host.

Threads that start and end inside the window are missed (their time is lost); threads
that end are counted up to their last snapshot. Without ``/proc`` every figure is zero.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from afd_core.tools.launch.processes import session_processes

_PROC = Path("/proc")


@dataclass(frozen=True)
class Snapshot:
    """Per-thread (cpu ns, run delay ns) keyed by (pid, tid), each pid's ``comm``, and the
    host's (busy, total) CPU time in clock ticks."""

    threads: dict[tuple[int, int], tuple[int, int]]
    names: dict[int, str]
    host_busy: int
    host_total: int


@dataclass
class WindowTimes:
    """What the processes did in one window (seconds).

    ``cpu`` and ``delay`` map a process kind to its threads' summed CPU time and run
    delay; ``host_busy`` is the fraction of all the host's CPU time that was busy.
    """

    cpu: dict[str, float] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    host_busy: float = 0.0

    @property
    def total_cpu(self) -> float:
        """CPU time of every process (s)."""
        return sum(self.cpu.values())

    @property
    def total_delay(self) -> float:
        """Run delay of every thread (s)."""
        return sum(self.delay.values())


def snapshot(sessions: Mapping[str, int]) -> Snapshot:
    """The schedstat counters of every thread of ``sessions`` (server name -> session id)
    now, and the host's; a process's kind is ``<server name>:<comm>``."""
    threads: dict[tuple[int, int], tuple[int, int]] = {}
    names: dict[int, str] = {}
    for server, sid in sessions.items():
        for pid in session_processes(sid):
            try:
                comm = (_PROC / str(pid) / "comm").read_text().strip()
                names[pid] = f"{server}:{comm}"
                tids = [int(t.name) for t in (_PROC / str(pid) / "task").iterdir()]
            except OSError:
                continue  # ended while scanning
            for tid in tids:
                try:
                    stat = (_PROC / str(pid) / "task" / str(tid) / "schedstat").read_text()
                    cpu, delay = stat.split()[:2]
                except (OSError, ValueError):
                    continue
                threads[pid, tid] = (int(cpu), int(delay))
    busy, total = _host_ticks()
    return Snapshot(threads, names, busy, total)


def window(before: Snapshot, after: Snapshot) -> WindowTimes:
    """What happened between two snapshots of the same sessions."""
    times = WindowTimes()
    for key, (cpu, delay) in after.threads.items():
        cpu0, delay0 = before.threads.get(key, (0, 0))
        kind = after.names.get(key[0], "?")
        times.cpu[kind] = times.cpu.get(kind, 0.0) + (cpu - cpu0) / 1e9
        times.delay[kind] = times.delay.get(kind, 0.0) + (delay - delay0) / 1e9
    total = after.host_total - before.host_total
    times.host_busy = (after.host_busy - before.host_busy) / total if total > 0 else 0.0
    return times


def _host_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the host since boot; idle and iowait are not busy."""
    try:
        line = (_PROC / "stat").read_text().split("\n", 1)[0]
        fields = [int(x) for x in line.split()[1:9]]  # user .. steal (guest is in user)
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
