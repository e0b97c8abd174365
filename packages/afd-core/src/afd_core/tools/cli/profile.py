"""``afd profile URL... --seconds N``: one wall-clock profiling window over every server.

The FFN role's steps are driven by the attention ranks and never line up with the
attention role's scheduler steps, so an iteration count cannot frame the same work on
both roles. This command starts the profiles of all the given servers (attention and
FFN, each started with vLLM's ``--profiler-config``) at the same moment, waits ``N``
seconds, and stops them all at the same moment, through vLLM's ``POST /start_profile``
and ``POST /stop_profile``: each request is sent on its own thread, so the servers start
and stop within milliseconds of each other. Each server writes one trace per rank into
its ``torch_profiler_dir`` when its profile stops (``afd-attention<rank>...``,
``afd-ffn<rank>...``). Exits 1 when a server refuses (for example one started without
``--profiler-config``), 2 for invalid arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from afd_core.tools.cli._inputs import EXIT_FAILED, EXIT_INVALID, url_problem

#: Seconds one start or stop request may take (stopping writes the trace first).
REQUEST_TIMEOUT_S = 300.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``profile`` to the ``afd`` subcommands and return its parser."""
    parser = subparsers.add_parser(
        "profile",
        help="profile every server of a deployment over one wall-clock window",
        description=(
            "Start the torch profiles of every given vLLM server (attention and FFN, each "
            "started with --profiler-config) at the same moment, wait --seconds, then stop "
            "them all at the same moment; each server writes its traces to its "
            "torch_profiler_dir."
        ),
    )
    parser.add_argument("urls", nargs="+", metavar="URL", help="base URL of a server")
    parser.add_argument("--seconds", type=float, required=True, metavar="N")
    parser.add_argument(
        "--prefix", metavar="NAME", help="added to every trace name (vLLM's profile_prefix)"
    )
    return parser


def post_all(urls: Sequence[str], path: str, body: dict[str, Any] | None) -> list[str | None]:
    """``POST`` ``path`` to every URL at once; per URL None or the error text."""
    errors: list[str | None] = [None] * len(urls)
    data = json.dumps(body).encode() if body else None

    def post(i: int) -> None:
        request = urllib.request.Request(
            urls[i].rstrip("/") + path,
            data=data or b"",
            headers={"Content-Type": "application/json"} if data else {},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S):
                pass
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            errors[i] = f"HTTP {exc.code} {detail}".strip()
        except (OSError, ValueError) as exc:
            errors[i] = str(exc)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(urls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def run(args: argparse.Namespace) -> int:
    """Start, wait, stop; print what each server did."""
    problems = [url_problem(url) for url in args.urls]
    if args.seconds <= 0:
        problems.append(f"--seconds must be positive, got {args.seconds:g}")
    for problem in problems:
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_INVALID
    body = {"profile_prefix": args.prefix} if args.prefix else None
    started = post_all(args.urls, "/start_profile", body)
    failed = [(url, err) for url, err in zip(args.urls, started, strict=True) if err]
    if failed:
        for url, err in failed:
            print(
                f"error: {url} did not start its profile: {err} (was it started with "
                "--profiler-config.profiler=torch and a torch_profiler_dir?)",
                file=sys.stderr,
            )
        post_all(
            [u for u, e in zip(args.urls, started, strict=True) if not e], "/stop_profile", None
        )
        return EXIT_FAILED
    print(f"profiling {len(args.urls)} server(s) for {args.seconds:g} s")
    time.sleep(args.seconds)
    stopped = post_all(args.urls, "/stop_profile", None)
    status = 0
    for url, err in zip(args.urls, stopped, strict=True):
        if err:
            print(f"error: {url} did not stop its profile: {err}", file=sys.stderr)
            status = EXIT_FAILED
    if status == 0:
        print("profiles stopped; each server wrote its traces to its torch_profiler_dir")
    return status
