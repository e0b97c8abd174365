"""``afd measure MODEL_DIR --out P.json``: time one attention layer and one MoE layer of
the model on this machine with vLLM's own kernels, and write a hardware profile with
those tables for ``afd plan --profile P.json``.

The timing runs in a child process (:mod:`afd_core.plan.vllm_timing`: an in-process
vLLM engine, no server) over a small grid (by default batches 1..32 at two contexts,
seconds of work after the engine's start-up); a second child times whole decode steps
with vLLM's engine core and worker in their own processes, as a server runs them, and
the difference per batch becomes the profile's ``serving_overhead`` (``--no-served``
skips it). The HTTP server's work (OpenAI API, streaming) is in neither. What the
tables do not cover (the link, device memory, dense MLPs of models without one) comes
from the ``--base`` profile, which the written profile names in its ``source``. Pin the
process to the cores a role will get (``taskset -c 0 afd measure ...``; the served run's
processes inherit it) to measure what that role will see. Exits 0 once the profile is
written, 1 when a timing run fails, 2 for invalid input.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from afd_core.errors import AFDConfigError, AFDError
from afd_core.plan.measured import build_tables
from afd_core.plan.model_shape import ModelShape, load_model_shape
from afd_core.plan.profile import HardwareProfile, load_profile, profile_document
from afd_core.tools.cli._inputs import EXIT_FAILED, EXIT_INVALID, model_dir_problem

DEFAULT_BATCHES = "1,2,4,8,16,32"
DEFAULT_CONTEXTS = "32,160"
DEFAULT_STEPS = 6
#: Lines of the child's output shown when it fails.
LOG_TAIL_LINES = 20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``measure`` to the ``afd`` subcommands and return its parser."""
    parser = subparsers.add_parser(
        "measure",
        help="time a model's attention and MoE layers here and write a hardware profile",
        description=(
            "Time one attention layer and one MoE layer of MODEL_DIR with vLLM's own "
            "kernels on this machine over a grid of batch sizes and contexts (an "
            "in-process vLLM engine; no server), and write a hardware profile for afd plan."
        ),
    )
    parser.add_argument("model", metavar="MODEL_DIR", help="model directory with config.json")
    parser.add_argument("--out", required=True, metavar="PROFILE_JSON")
    parser.add_argument(
        "--base",
        default="cpu-core",
        metavar="PROFILE",
        help="profile for what is not measured: link, memory (default cpu-core)",
    )
    parser.add_argument(
        "--batches",
        default=DEFAULT_BATCHES,
        metavar="B,B,...",
        help=f"decode batch sizes, increasing (default {DEFAULT_BATCHES})",
    )
    parser.add_argument(
        "--contexts",
        default=DEFAULT_CONTEXTS,
        metavar="C,C,...",
        help=f"prompt lengths, increasing (default {DEFAULT_CONTEXTS})",
    )
    parser.add_argument(
        "--no-served",
        dest="served",
        action="store_false",
        help="skip the served-step run (no serving_overhead in the profile)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        metavar="N",
        help=f"decode steps per point, at least 3 (default {DEFAULT_STEPS})",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Check the input, time the grid in a child process, write the profile."""
    model, out = Path(args.model), Path(args.out)
    try:
        problem = model_dir_problem(model, "MODEL_DIR")
        if problem is not None:
            raise AFDConfigError(problem)
        if not out.parent.is_dir():
            raise AFDConfigError(f"--out: folder {str(out.parent)!r} does not exist; create it")
        batches = _grid(args.batches, "--batches", minimum=2)
        contexts = _grid(args.contexts, "--contexts", minimum=1)
        if args.steps < 3:
            raise AFDConfigError(f"--steps must be at least 3, got {args.steps}")
        shape = load_model_shape(model)
        base = load_profile(args.base)
        if shape.max_context and contexts[-1] + args.steps + 1 > shape.max_context:
            raise AFDConfigError(
                f"--contexts {contexts[-1]} plus {args.steps} steps exceeds the model's "
                f"max_position_embeddings ({shape.max_context}); pass shorter contexts"
            )
    except AFDError as exc:
        print(f"error: afd measure: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_INVALID
    print(f"timing {model} over batches {batches} and contexts {contexts} (vLLM start-up first)")
    samples, failure = _time_in_child(model, batches, contexts, args.steps, served=False)
    served: dict[str, Any] | None = None
    if samples is not None and args.served:
        print("timing served decode steps (engine core and worker in their own processes)")
        served, failure = _time_in_child(model, batches, contexts, args.steps, served=True)
    if samples is None or (args.served and served is None):
        print(f"error: afd measure: the timing run failed:\n{failure}", file=sys.stderr)
        return EXIT_FAILED
    profile = measured_profile(shape, base, model, samples, served)
    out.write_text(json.dumps(profile_document(profile), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {profile.name}")
    return 0


def measured_profile(
    shape: ModelShape,
    base: HardwareProfile,
    model: Path,
    samples: dict[str, Any],
    served: dict[str, Any] | None = None,
) -> HardwareProfile:
    """A profile of ``base`` with the tables made from the children's ``samples`` (and
    ``served``: then ``serving_overhead`` too, see :func:`serving_overhead`)."""
    method = samples["method"]
    if served is not None:
        method += f"; serving_overhead: {served['method']}, less the in-process step"
    tables = build_tables(
        model=shape.fingerprint(),
        method=method,
        threads=samples["threads"],
        attention={(b, c): s for b, c, s in samples["attention"]},
        moe={t: s for t, s in samples["moe"]},
        step_overhead={b: s for b, s in samples["step_overhead"]},
        dense={t: s for t, s in samples["dense"]} or None,
        serving_overhead=None if served is None else serving_overhead(samples, served),
    )
    return HardwareProfile(
        name=f"{base.name}, measured on {model.name}",
        source=(
            f"Layer times: afd measure ({method}). Everything else (device "
            f"memory, link, the roofline for what the tables do not cover) from profile "
            f"{base.name}: {base.source}"
        ),
        device=base.device,
        link=base.link,
        measured=tables,
    )


def serving_overhead(samples: dict[str, Any], served: dict[str, Any]) -> dict[int, float]:
    """Per batch, the median over contexts of the served step less the in-process step
    at the same (batch, context); at least 1 ns (a table holds positive times).

    Raises AFDConfigError when the two runs do not cover the same points.
    """
    inprocess = {(b, c): s for b, c, s in samples["step"]}
    extra: dict[int, list[float]] = {}
    for b, c, s in served["served_step"]:
        if (b, c) not in inprocess:
            raise AFDConfigError(f"the served run timed (batch, context) {(b, c)} only")
        extra.setdefault(b, []).append(s - inprocess[b, c])
    return {b: max(statistics.median(v), 1e-9) for b, v in sorted(extra.items())}


def _grid(text: str, option: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) < minimum or any(v < 1 for v in values) or values != sorted(set(values)):
        raise AFDConfigError(
            f"{option} must be at least {minimum} positive integers in increasing order, "
            f"comma-separated, got {text!r}"
        )
    return values


def _time_in_child(
    model: Path, batches: list[int], contexts: list[int], steps: int, served: bool
) -> tuple[dict[str, Any] | None, str]:
    """The child's samples (``served``: of served steps), or None and its output's tail."""
    multiprocessing = "1" if served else "0"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing, "VLLM_PLUGINS": ""}
    with tempfile.TemporaryDirectory(prefix="afd-measure-") as tmp:
        result_path = Path(tmp) / "samples.json"
        command = [
            sys.executable,
            "-m",
            "afd_core.plan.vllm_timing",
            str(model),
            str(result_path),
            "--batches",
            ",".join(map(str, batches)),
            "--contexts",
            ",".join(map(str, contexts)),
            "--steps",
            str(steps),
            *(["--served"] if served else []),
        ]
        child = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if child.returncode != 0 or not result_path.is_file():
            tail = (child.stdout + child.stderr).strip().splitlines()[-LOG_TAIL_LINES:]
            return None, "\n".join(tail)
        return json.loads(result_path.read_text(encoding="utf-8")), ""
