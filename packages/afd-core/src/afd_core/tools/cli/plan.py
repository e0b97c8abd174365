"""``afd plan MODEL_DIR --profile P --tpot-ms T [--gpus N] ...``: the best AFD deployment
on N devices, and what it buys over monolithic vLLM with expert parallelism.

Reads the model's ``config.json`` and a hardware profile (a preset name or a JSON file,
for example one ``afd measure`` wrote), searches A:F splits, batch per attention rank and
stage count under the TPOT bound and both roles' memory (:mod:`afd_core.plan`), and
prints the plan, the monolithic baseline, their ratio and what binds; ``--json`` prints
the same as one JSON object. Fixing ``--attention-ranks``, ``--ffn-ranks``, ``--batch``,
``--stages``, ``--layout`` or ``--baseline-batch`` evaluates that deployment instead of
searching for it. Exits 0 with a plan (even one that finds no feasible deployment, which
it says), 2 for invalid input. Nothing is started.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from afd_core.errors import AFDConfigError, AFDError
from afd_core.plan import SLO, Space, load_model_shape, load_profile, plan, preset_names
from afd_core.plan.report import describe, plan_document
from afd_core.plan.search import DEFAULT_MAX_BATCH
from afd_core.plan.step import LAYOUTS
from afd_core.tools.cli._inputs import EXIT_INVALID, model_dir_problem

#: The context per sequence when --context is not given (capped by the model's own).
DEFAULT_CONTEXT = 1024
#: Devices when neither --gpus nor both rank counts are given: one 8-GPU node.
DEFAULT_DEVICES = 8


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan`` to the ``afd`` subcommands and return its parser."""
    parser = subparsers.add_parser(
        "plan",
        help="predict the best A:F split, batch and stages, against monolithic vLLM",
        description=(
            "Predict the AFD deployment (attention ranks, FFN ranks, batch per attention "
            "rank, stages) with the most tokens per second per device under a TPOT bound, "
            "and monolithic vLLM with expert parallelism on the same devices. PROFILE is a "
            f"profile JSON file or a preset ({', '.join(preset_names())})."
        ),
    )
    parser.add_argument("model", metavar="MODEL_DIR", help="model directory with config.json")
    parser.add_argument("--profile", required=True, metavar="PROFILE")
    parser.add_argument(
        "--tpot-ms", type=float, required=True, metavar="MS", help="time per output token bound"
    )
    parser.add_argument(
        "--ttft-ms",
        type=float,
        metavar="MS",
        help="time to first token bound (checked against a one-prompt prefill)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help=f"devices in all, attention and FFN together (default: --attention-ranks plus "
        f"--ffn-ranks when both are given, else {DEFAULT_DEVICES})",
    )
    parser.add_argument(
        "--context",
        type=int,
        metavar="TOKENS",
        help=f"cached tokens per sequence (default {DEFAULT_CONTEXT}, or the "
        "model's max_position_embeddings when smaller)",
    )
    parser.add_argument("--attention-ranks", type=int, metavar="A", help="fix A")
    parser.add_argument("--ffn-ranks", type=int, metavar="F", help="fix F")
    parser.add_argument("--batch", type=int, metavar="B", help="fix the batch per attention rank")
    parser.add_argument("--stages", type=int, choices=(1, 2), help="fix the stage count")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        help="fix the layout: p2p (P2P connectors) or expert (expert-routed)",
    )
    parser.add_argument(
        "--baseline-batch", type=int, metavar="B", help="fix monolithic vLLM's batch per device"
    )
    parser.add_argument(
        "--baseline-stages",
        type=int,
        choices=(1, 2),
        help="fix monolithic vLLM's stage count (2: DBO)",
    )
    parser.add_argument(
        "--baseline-gpus",
        type=int,
        metavar="N",
        help="devices of one monolithic replica (default --gpus), e.g. one "
        "node of EP within the node",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        metavar="B",
        help=f"largest batch searched (default {DEFAULT_MAX_BATCH})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def run(args: argparse.Namespace) -> int:
    """Plan and print; exit 0, or 2 with one error line for invalid input."""
    problem = model_dir_problem(Path(args.model), "MODEL_DIR") or _number_problem(args)
    if problem is not None:
        print(f"error: afd plan: {problem}", file=sys.stderr)
        return EXIT_INVALID
    try:
        shape = load_model_shape(Path(args.model))
        profile = load_profile(args.profile)
        context = _context(args.context, shape.max_context)
        slo = SLO(args.tpot_ms / 1e3, None if args.ttft_ms is None else args.ttft_ms / 1e3)
        space = Space(
            devices=_devices(args),
            context=context,
            layouts=(args.layout,) if args.layout else LAYOUTS,
            attention_ranks=args.attention_ranks,
            ffn_ranks=args.ffn_ranks,
            batch=args.batch,
            stages=(args.stages,) if args.stages else (1, 2),
            baseline_batch=args.baseline_batch,
            baseline_devices=args.baseline_gpus,
            baseline_stages=(args.baseline_stages,) if args.baseline_stages else (1, 2),
            max_batch=args.max_batch,
        )
        result = plan(shape, profile, slo, space)
    except AFDError as exc:
        print(f"error: afd plan: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps(plan_document(result, shape, profile, slo, space), indent=2))
    else:
        print(describe(result, shape, profile, slo, space))
    return 0


def _number_problem(args: argparse.Namespace) -> str | None:
    positive = {
        "--tpot-ms": args.tpot_ms,
        "--ttft-ms": args.ttft_ms,
        "--gpus": args.gpus,
        "--context": args.context,
        "--attention-ranks": args.attention_ranks,
        "--ffn-ranks": args.ffn_ranks,
        "--batch": args.batch,
        "--baseline-batch": args.baseline_batch,
        "--baseline-gpus": args.baseline_gpus,
        "--max-batch": args.max_batch,
    }
    for option, value in positive.items():
        if value is not None and not value > 0:
            return f"{option} must be positive, got {value:g}"
    return None


def _devices(args: argparse.Namespace) -> int:
    """``--gpus``, or A + F when both are fixed, or :data:`DEFAULT_DEVICES`."""
    if args.gpus is not None:
        return int(args.gpus)
    if args.attention_ranks is not None and args.ffn_ranks is not None:
        return int(args.attention_ranks + args.ffn_ranks)
    return DEFAULT_DEVICES


def _context(given: int | None, model_limit: int) -> int:
    """``--context``, or its default; AFDConfigError beyond the model's positions."""
    if given is None:
        return min(DEFAULT_CONTEXT, model_limit) if model_limit else DEFAULT_CONTEXT
    if model_limit and given > model_limit:
        raise AFDConfigError(
            f"--context {given} exceeds the model's max_position_embeddings ({model_limit}); "
            "pass a shorter context"
        )
    return given
