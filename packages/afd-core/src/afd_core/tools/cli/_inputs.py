"""The ``afd`` subcommands' exit statuses and the checks of what a user passes them.

A user's mistake (a missing file or directory, a model directory without
``config.json``, a URL that is not one, a port already taken) is found before anything
starts and answered with one line that says what to do, and :data:`EXIT_INVALID`; a
failure of what was started is :data:`EXIT_FAILED`. Each check returns that line, or
None when the input is fine.
"""

from __future__ import annotations

import errno
import socket
import urllib.parse
from pathlib import Path

#: Something started failed (a server died, a profile did not stop).
EXIT_FAILED = 1
#: The user's input is wrong; nothing was started.
EXIT_INVALID = 2


def model_dir_problem(model: Path, option: str) -> str | None:
    """Why ``model`` (given as ``option``) is not a model directory, or None."""
    if not model.is_dir():
        return f"{option} {str(model)!r} is not a directory; pass a local model directory"
    if not (model / "config.json").is_file():
        return (
            f"{option} {str(model)!r} has no config.json; pass a Hugging Face model "
            "directory (config.json, weights, tokenizer)"
        )
    return None


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a server's base URL (``http://HOST:PORT``), or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{url!r} is not a server URL; pass its base URL, e.g. http://127.0.0.1:8000"
    return None


def port_problem(host: str, port: int, option: str) -> str | None:
    """Why this machine cannot serve on ``host``:``port`` (given through ``option``), or
    None. A check, not a reservation: another process may take the port afterwards."""
    if not 0 < port < 65536:
        return f"{option}: port {port} is outside 1-65535"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{option}: port {port} is in use; pick another, or leave it out"
            return f"{option}: cannot serve on {host}:{port} ({exc.strerror or exc})"
    return None
