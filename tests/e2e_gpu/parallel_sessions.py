"""Run several pytest sessions of the GPU suite side by side, each on its own GPU pair.

A host with four GPUs runs two NCCL deployments at once; more sessions may share GPUs
(each NCCL group pairs two different GPUs, and every server claims a small share of a
GPU's memory). Each session gets ``$AFD_E2E_ROLE_GPUS`` (see ``gpu_settings.role_gpus``),
its own ``--basetemp`` and its own log file::

    python tests/e2e_gpu/parallel_sessions.py --logs $OUT --timeout-s 540 \\
        --session "0,1: tests/e2e_gpu/test_nccl_connector.py" \\
        --session "2,3: tests/e2e_gpu/test_afd_cuda_exactness.py -k 'P2pNccl and eager'"

A session still running at the timeout gets SIGINT (pytest then runs its fixtures'
teardown, which stops the servers), and SIGKILL for its process group 30 s later; so do
all sessions when this script gets SIGINT or SIGTERM. Servers that a killed pytest
started in their own process sessions outlive it. Exits non-zero unless every session
passed. The servers' logs of all sessions are packed into ``LOGS/server-logs.tar.gz``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: Seconds between SIGINT and SIGKILL for a session that outlived its timeout.
KILL_GRACE_S = 30.0


@dataclass
class Session:
    """One pytest process, its GPUs and where its output goes."""

    index: int
    gpus: str
    pytest_args: list[str]
    log_path: Path
    basetemp: Path
    process: subprocess.Popen[bytes] | None = None
    interrupted_at: float | None = None

    @classmethod
    def parse(cls, index: int, text: str, logs: Path, temp_root: Path) -> Session:
        """``"A,F: PYTEST ARGS"`` (attention GPU, FFN GPU, then pytest's arguments)."""
        gpus, sep, rest = text.partition(":")
        if not sep or not rest.strip():
            raise SystemExit(f"--session {text!r}: write 'ATTENTION_GPU,FFN_GPU: pytest args'")
        return cls(
            index=index,
            gpus=gpus.strip(),
            pytest_args=shlex.split(rest),
            log_path=logs / f"session-{index}.log",
            basetemp=temp_root / f"session-{index}",
        )

    def start(self) -> None:
        env = os.environ | {"AFD_E2E_ROLE_GPUS": self.gpus, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "pytest", "-q", "-rs", "-s", "-p", "no:cacheprovider",
                   f"--basetemp={self.basetemp}", *self.pytest_args]  # fmt: skip
        with self.log_path.open("wb") as log:
            log.write(f"$ AFD_E2E_ROLE_GPUS={self.gpus} {shlex.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_default_sigint,
            )

    def enforce(self, deadline: float) -> None:
        """SIGINT after ``deadline``, SIGKILL to the process group after the grace."""
        assert self.process is not None
        if self.process.poll() is not None:
            return
        now = time.monotonic()
        if self.interrupted_at is None and now > deadline:
            self.interrupted_at = now
            os.killpg(self.process.pid, signal.SIGINT)
        elif self.interrupted_at is not None and now > self.interrupted_at + KILL_GRACE_S:
            os.killpg(self.process.pid, signal.SIGKILL)

    def summary(self) -> str:
        assert self.process is not None
        lines = self.log_path.read_text(errors="replace").splitlines()
        last = next((line for line in reversed(lines) if line.strip()), "")
        late = " (interrupted at the timeout)" if self.interrupted_at is not None else ""
        return f"session {self.index} [{self.gpus}] rc={self.process.returncode}{late}: {last}"


def _default_sigint() -> None:
    """In the child: take SIGINT again even when this script was started ignoring it (a
    background job of a non-interactive shell), so pytest gets KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(sessions: list[Session], deadline: float) -> None:
    """Return once every started session ended, interrupting them after ``deadline``."""
    started = [s for s in sessions if s.process is not None]
    while any(s.process is not None and s.process.poll() is None for s in started):
        for session in started:
            session.enforce(deadline)
        time.sleep(1.0)


def pack_server_logs(temp_root: Path, archive: Path) -> None:
    """Every ``*.log`` under the sessions' temporary folders, in one gzipped tar."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(temp_root.rglob("*.log")):
            tar.add(path, arcname=str(path.relative_to(temp_root)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session", action="append", required=True, help="'A,F: pytest args'")
    parser.add_argument("--logs", type=Path, required=True, help="folder for the logs")
    parser.add_argument("--timeout-s", type=float, default=540.0)
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    temp_root = Path(tempfile.mkdtemp(prefix="afd-e2e-gpu-"))
    sessions = [Session.parse(i, text, args.logs, temp_root) for i, text in enumerate(args.session)]
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    try:
        for session in sessions:
            session.start()
        wait_for(sessions, started + args.timeout_s)
    except BaseException:  # a signal or a failed start: interrupt the sessions started
        wait_for(sessions, time.monotonic())
        raise
    print(f"{len(sessions)} sessions in {time.monotonic() - started:.0f} s")
    for session in sessions:
        print(session.summary())
    pack_server_logs(temp_root, args.logs / "server-logs.tar.gz")
    return 0 if all(s.process is not None and s.process.returncode == 0 for s in sessions) else 1


if __name__ == "__main__":
    sys.exit(main())
