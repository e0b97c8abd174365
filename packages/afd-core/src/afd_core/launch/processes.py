"""Find and end the processes a launcher started, including vLLM's grandchildren.

Every server process is started with the environment variable :data:`TAG_VARIABLE` set
to ``"<launcher pid>/<server name>"``; vLLM's engine-core and worker processes inherit
it, so the whole tree can be found by reading ``/proc/<pid>/environ``, even processes
that were re-parented or left the process group. Zombies are ignored: they hold no
resources and are reaped by their parent. Without ``/proc`` (not Linux) the search
finds nothing and callers rely on process groups alone.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TAG_VARIABLE = "AFD_LAUNCH_TAG"
_PROC = Path("/proc")


def launch_tag(server_name: str, owner_pid: int | None = None) -> str:
    """The tag of ``server_name`` started by ``owner_pid`` (default: this process)."""
    return f"{os.getpid() if owner_pid is None else owner_pid}/{server_name}"


def tagged_processes(prefix: str) -> dict[int, str]:
    """Live (non-zombie) processes whose tag starts with ``prefix``: ``{pid: tag}``.

    ``prefix`` is a whole tag or ``"<launcher pid>/"`` for everything one launcher
    started. Processes that vanish or cannot be read while scanning are skipped.
    """
    found: dict[int, str] = {}
    if not _PROC.is_dir():
        return found
    needle = f"{TAG_VARIABLE}={prefix}".encode()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ or _is_zombie(entry):
                continue
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(needle):
                found[int(entry.name)] = item.decode(errors="replace").partition("=")[2]
    return found


def kill_tagged(prefix: str, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL every process tagged with ``prefix``; return their pids.

    Waits up to ``timeout_s`` until none is left alive (zombies do not count).
    """
    pids = sorted(tagged_processes(prefix))
    for pid in pids:
        signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while tagged_processes(prefix) and time.monotonic() < deadline:
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


def _is_zombie(entry: Path) -> bool:
    # /proc/<pid>/stat: "pid (comm) state ..."; comm may contain spaces and parentheses.
    stat = (entry / "stat").read_text()
    return stat[stat.rindex(")") + 2 :].startswith(("Z", "X"))
