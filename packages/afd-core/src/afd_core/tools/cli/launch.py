"""``afd launch MODEL_DIR``: run an AFD deployment on this machine until Ctrl-C.

Starts ``--num-ffn-ranks`` FFN servers and ``--num-attention-ranks`` attention servers of
the model (one vLLM API server each, see :mod:`afd_core.tools.launch`), waits until all are
healthy, prints the endpoint and blocks. Ctrl-C or SIGTERM stops every process and
exits 0; exits 1 when start-up fails or a server dies, 2 for an invalid setting.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from afd_core.errors import AFDConfigError, AFDError, AFDInstallError
from afd_core.tools.cli._inputs import EXIT_FAILED, EXIT_INVALID, model_dir_problem, port_problem
from afd_core.tools.launch import DEFAULT_CONNECTOR, DeploymentSpec, LocalDeployment
from afd_core.tools.launch.deployment import DEFAULT_START_TIMEOUT_S


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``launch`` to the ``afd`` subcommands and return its parser."""
    parser = subparsers.add_parser(
        "launch",
        help="start an FFN + attention deployment locally and serve until Ctrl-C",
        description=(
            "Start the FFN and attention servers of an AFD deployment of MODEL_DIR on this "
            "machine (one vLLM OpenAI API server per rank), wait until all are healthy, "
            "print the endpoint, and stop every process on Ctrl-C or SIGTERM."
        ),
    )
    parser.add_argument("model", type=Path, metavar="MODEL_DIR", help="a local model directory")
    parser.add_argument("--num-attention-ranks", type=int, default=1, metavar="A")
    parser.add_argument("--num-ffn-ranks", type=int, default=1, metavar="F")
    parser.add_argument(
        "--gate-on-attention",
        action="store_true",
        help="compute the MoE router on the attention role (compute_gate_on_attention)",
    )
    parser.add_argument(
        "--port",
        type=int,
        metavar="P",
        help="API port of attention server 0 (server a gets P + a; default: free ports)",
    )
    parser.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run without torch.compile (default: eager)",
    )
    parser.add_argument("--connector", default=DEFAULT_CONNECTOR, metavar="NAME")
    parser.add_argument(
        "--attention-first",
        action="store_true",
        help="start the attention servers before the FFN servers (default: FFN first)",
    )
    parser.add_argument(
        "--served-model-name", metavar="NAME", help="model name for clients (default: dir name)"
    )
    parser.add_argument(
        "--work-dir", type=Path, metavar="DIR", help="where logs go (default: a new temp dir)"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up when not healthy by then (default: {DEFAULT_START_TIMEOUT_S:.0f})",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Launch, serve until Ctrl-C/SIGTERM, stop everything; return the exit status."""
    problems = [model_dir_problem(args.model, "MODEL_DIR")]
    if args.port is not None:
        ports = range(args.port, args.port + max(args.num_attention_ranks, 1))
        problems += [port_problem(DeploymentSpec.host, port, "--port") for port in ports]
    for problem in problems:
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_INVALID
    spec = DeploymentSpec(
        model=args.model.resolve(),
        num_attention_ranks=args.num_attention_ranks,
        num_ffn_ranks=args.num_ffn_ranks,
        connector=args.connector,
        compute_gate_on_attention=args.gate_on_attention,
        enforce_eager=args.enforce_eager,
        ffn_first=not args.attention_first,
        attention_port=args.port,
        served_model_name=args.served_model_name,
        start_timeout_s=args.start_timeout,
    )
    deployment = LocalDeployment(spec, work_dir=args.work_dir, progress=_say)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    status = 0
    try:
        deployment.start()
        _say(f"serving model {deployment.model_name!r}:")
        for url in deployment.endpoints:
            _say(f"  {url}/v1  (OpenAI API)")
        _say("press Ctrl-C to stop")
        status = _serve(deployment)
    except KeyboardInterrupt:
        _say("stop requested")
    except (AFDConfigError, AFDInstallError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        status = EXIT_INVALID
    except AFDError as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = EXIT_FAILED
    finally:
        # A second Ctrl-C must not cut the (bounded) stop short and leave processes behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            status = _stop(deployment) or status
        finally:
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, previous)
    return status


def _serve(deployment: LocalDeployment) -> int:
    """Block until interrupted (raises KeyboardInterrupt) or a server dies (returns 1)."""
    while True:
        for server in deployment.servers:
            if not server.running:
                print(f"error: {server.spec.name} stopped; see {server.log_path}", file=sys.stderr)
                return EXIT_FAILED
        time.sleep(1.0)


def _stop(deployment: LocalDeployment) -> int:
    """Stop every server; 0 when no process is left, 1 otherwise."""
    if not deployment.servers:
        return 0
    _say(f"stopping {len(deployment.servers)} server(s)...")
    begin = time.monotonic()
    leftovers = deployment.stop()
    if leftovers:
        print(f"error: processes still running after stop: {leftovers}", file=sys.stderr)
        return EXIT_FAILED
    _say(f"all servers stopped in {time.monotonic() - begin:.1f} s; logs in {deployment.work_dir}")
    return 0


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _say(line: str) -> None:
    print(line, flush=True)
