"""The frontend of an AFD server and its descendants: who outlives whom, and the exit status.

The *frontend* is the process that builds the vLLM config of an AFD role: the API server
(``python -m vllm.entrypoints.openai.api_server``, ``vllm serve``) or the process of an
offline ``LLM``. vLLM starts the engine core from it and the workers from the engine core,
all with the frontend's environment. Two things vLLM 0.32 does not do, this module does:

* **Descendants end with the frontend.** When the API server is killed (``kill -9``, OOM
  killer), vLLM leaves its engine and workers running; an AFD worker would then keep its
  connector to the other role open, serving nobody. :func:`become_frontend` writes the
  frontend's pid into the environment (:data:`FRONTEND_PID_ENV`);
  :func:`watch_frontend`, called by the AFD plugin in every vLLM process, starts a
  daemon thread in each descendant that waits on the frontend's pid (a Linux pidfd, or a
  1 s poll where pidfds are missing) and, once it is gone, ends its own process with
  :func:`afd_core.workers.process_exit.exit_process` (SIGTERM to itself: vLLM's orderly exit,
  which closes the connector, so the peers see a goodbye). Bound: the frontend's exit
  is seen at once (pidfd) or within :data:`POLL_INTERVAL_S`; the process then has
  :data:`afd_core.workers.process_exit.EXIT_GRACE_S` to exit before it exits hard.
* **An API server outlives its engine by seconds at most.** vLLM's API server, stopped
  (SIGTERM, Ctrl-C) while a response streams, shuts its engine down but keeps serving
  the open connection: the client gets neither an error nor the end of its stream, and
  the process stays until the client gives up. In an API server process (``python -m
  vllm.entrypoints...``, ``vllm serve``) :func:`become_frontend` starts a thread that
  watches the engine core (its child ``VLLM::EngineCore``); once that is gone and the
  API server is still running :data:`ENGINE_GONE_GRACE_S` later, it ends the API
  server (the open connections close, so the clients see an error), with status 1 when
  a failure was recorded and 0 otherwise (what vLLM itself exits with after its engine
  died).
* **A stop signal is not lost while the engine starts.** In an API server process
  :func:`become_frontend` also installs
  :func:`afd_core.workers.startup_signals.relay_startup_signals`:
  a SIGTERM that the kernel hands to a thread other than the main thread, while the
  main thread waits for the engine (and so for the AFD rendezvous), is passed on to it.
* **A failure is a non-zero exit.** When an AFD worker ends itself because of a failure
  (a lost peer, a protocol error, an FFN loop that failed), vLLM's API server shuts down
  and exits with status 0. The worker writes the failure into the frontend's failure
  record (:func:`record_failure`, a file named by :data:`FAILURE_RECORD_ENV`); at exit the
  frontend finds it, logs it and exits with :data:`FAILURE_EXIT_STATUS`. A server stopped
  on purpose (SIGTERM, Ctrl-C) with no failure recorded keeps vLLM's own status.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import sys
import tempfile
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path

from afd_core.workers.procfs import read_stat
from afd_core.workers.startup_signals import relay_startup_signals

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: Environment variable holding the frontend's pid (set by :func:`become_frontend`).
FRONTEND_PID_ENV = "AFD_FRONTEND_PID"
#: Environment variable naming the frontend's failure record file.
FAILURE_RECORD_ENV = "AFD_FAILURE_RECORD"
#: Exit status of a frontend whose deployment ended because of a recorded failure.
FAILURE_EXIT_STATUS = 1
#: Seconds between two checks of the frontend's pid where pidfds are not available.
POLL_INTERVAL_S = 1.0
#: Name of the watching thread (visible in ``py-spy dump`` and thread listings).
WATCH_THREAD_NAME = "afd-frontend-watch"
#: Seconds an API server may run on after its engine core ended before it is ended.
ENGINE_GONE_GRACE_S = 5.0
#: How vLLM names its engine core process (``/proc/<pid>/comm`` keeps 15 characters).
ENGINE_PROCESS_NAME = "VLLM::EngineCore"[:15]

_frontend_lock = threading.Lock()
_is_frontend = False
_watching = False


def become_frontend(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make this process the frontend of its AFD server (idempotent).

    Writes :data:`FRONTEND_PID_ENV` and :data:`FAILURE_RECORD_ENV` into ``environ`` (so
    the engine and workers started afterwards inherit them) and registers the exit hook
    that turns a recorded failure into exit status :data:`FAILURE_EXIT_STATUS`. Must run
    before vLLM starts the engine (the AFD config hook does it).
    """
    global _is_frontend
    with _frontend_lock:
        if _is_frontend:
            return
        _is_frontend = True
    record = Path(tempfile.gettempdir()) / f"afd-failure-{os.getpid()}"
    record.unlink(missing_ok=True)
    environ[FRONTEND_PID_ENV] = str(os.getpid())
    environ[FAILURE_RECORD_ENV] = str(record)
    atexit.register(_exit_with_recorded_failure, record)
    if is_api_server(sys.argv):
        relay_startup_signals()
        threading.Thread(
            target=_end_when_the_engine_is_gone,
            args=(record,),
            name="afd-frontend-engine-watch",
            daemon=True,
        ).start()


def is_api_server(argv: list[str]) -> bool:
    """Whether this process is a vLLM API server (``python -m vllm.entrypoints...`` or
    the ``vllm`` command), not a program using vLLM offline."""
    program = argv[0] if argv else ""
    return "vllm/entrypoints/" in program.replace(os.sep, "/") or Path(program).name == "vllm"


def _end_when_the_engine_is_gone(record: Path) -> None:
    seen = False
    while True:
        time.sleep(POLL_INTERVAL_S / 2)
        running = bool(_children_named(os.getpid(), ENGINE_PROCESS_NAME))
        seen = seen or running
        if seen and not running:
            break
    time.sleep(ENGINE_GONE_GRACE_S)
    failure = recorded_failure(record)
    status = FAILURE_EXIT_STATUS if failure else 0
    logger.warning(
        "AFD: the engine of this API server ended %g s ago but the server still runs (an "
        "open connection holds it); ending it with status %d",
        ENGINE_GONE_GRACE_S,
        status,
    )
    flush_logs()
    record.unlink(missing_ok=True)
    os._exit(status)


def _children_named(pid: int, name: str) -> list[int]:
    """Live child processes of ``pid`` whose command name is ``name`` (from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:
            continue
        for child in children:
            stat = read_stat(child)
            if stat is not None and stat.comm == name and stat.alive:
                found.append(int(child))
    return found


def record_failure(
    role: str, exc: BaseException, environ: MutableMapping[str, str] = os.environ
) -> None:
    """Tell this process's frontend that ``role`` ended because of ``exc`` (best effort).

    Does nothing outside an AFD server (no :data:`FAILURE_RECORD_ENV`). The first failure
    recorded wins: a later one (a peer noticing this rank leave) does not replace it.
    """
    path = environ.get(FAILURE_RECORD_ENV)
    if not path:
        return
    try:
        with open(path, "x", encoding="utf-8") as record:
            record.write(f"AFD {role}: {type(exc).__name__}: {exc}\n")
    except FileExistsError:
        pass
    except OSError as error:
        logger.warning("AFD: could not record the failure in %s (%s)", path, error)


def flush_logs() -> None:
    """Flush vLLM's log handlers and the standard streams (before a hard exit)."""
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def recorded_failure(record: Path) -> str | None:
    """The failure written into ``record`` by a descendant, or None."""
    try:
        return record.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _exit_with_recorded_failure(record: Path) -> None:
    failure = recorded_failure(record)
    record.unlink(missing_ok=True)
    if failure is None:
        return
    logger.error(
        "AFD: this server ended because of a failure (%s); exit status %d",
        failure,
        FAILURE_EXIT_STATUS,
    )
    flush_logs()
    os._exit(FAILURE_EXIT_STATUS)


def watch_frontend(environ: MutableMapping[str, str] = os.environ) -> bool:
    """In a descendant of an AFD frontend, end this process when the frontend is gone.

    Returns True when a watch runs (started now or earlier); False in the frontend
    itself, outside an AFD server, or when the pid in the environment is not an ancestor
    of this process (an environment inherited from elsewhere is ignored).
    """
    global _watching
    frontend = _frontend_pid(environ)
    if frontend is None or frontend == os.getpid() or not _is_ancestor(frontend):
        return False
    with _frontend_lock:
        if _watching:
            return True
        _watching = True
    thread = threading.Thread(
        target=_wait_then_exit, args=(frontend,), name=WATCH_THREAD_NAME, daemon=True
    )
    thread.start()
    return True


def _frontend_pid(environ: MutableMapping[str, str]) -> int | None:
    try:
        return int(environ[FRONTEND_PID_ENV])
    except (KeyError, ValueError):
        return None


def _is_ancestor(pid: int) -> bool:
    """Whether ``pid`` is this process's parent, grandparent, ... (read from /proc)."""
    current = os.getppid()
    while current > 1:
        if current == pid:
            return True
        stat = read_stat(current)
        if stat is None:
            return False
        current = stat.ppid
    return False


def _wait_then_exit(frontend: int) -> None:
    wait_for_exit(frontend)
    from afd_core.workers.process_exit import exit_process

    exit_process(f"the API server process of this AFD server (pid {frontend}) is gone")


def wait_for_exit(pid: int) -> None:
    """Block until ancestor process ``pid`` has ended (a pidfd, else a poll of the ancestry)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        # An ended ancestor leaves the ancestry (its children are re-parented).
        while _is_ancestor(pid):
            time.sleep(POLL_INTERVAL_S)
        return
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll(None):
            pass
    finally:
        os.close(pidfd)
