"""The ``measured`` part of a hardware profile: one model's layers timed on one device.

``afd measure`` writes it; the cost model uses it in place of the roofline for that model
(and refuses it for any other: the ``model`` fingerprint must match). Schema::

    "measured": {
      "model": {...},            # ModelShape.fingerprint() of the measured model
      "method": "how the times were taken",
      "threads": 1,              # torch threads of the measured process
      "attention": {"batches": [1, 4], "contexts": [64, 256],
                    "seconds": [[a11, a12], [a21, a22]]},   # one layer, per decode step
      "moe": {"tokens": [1, 4, 64], "seconds": [...]},      # one sparse layer's MLP block
      "dense": {"tokens": [...], "seconds": [...]},         # optional: one dense MLP
      "step_overhead": {"batches": [1, 4], "seconds": [...]},
      "serving_overhead": {"batches": [1, 4], "seconds": [...]}   # optional (version 2)
    }

``moe`` is the whole MLP block of a sparse layer (gate, shared and routed experts) with
every routed expert on the one device; ``step_overhead`` is a decode step's time outside
the decoder layers in an in-process engine (input preparation, embedding, final norm, LM
head, sampling, scheduling, detokenization); ``serving_overhead`` is what a decode step
costs more when vLLM's engine core and worker run in their own processes on the same
cores, as a server runs them (their inter-process messages and spin-waits, the front
end's output processing): the served step's wall time less the in-process one. Neither
holds the HTTP server's work (the OpenAI API, SSE streaming).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from afd_core.errors import AFDConfigError
from afd_core.plan.strict_json import json_object
from afd_core.plan.tables import Curve, Grid

_KEYS = {
    "model",
    "method",
    "threads",
    "attention",
    "moe",
    "dense",
    "step_overhead",
    "serving_overhead",
}


@dataclass(frozen=True)
class MeasuredTables:
    """Times of one model's layers on one device (see the module docstring)."""

    model: Mapping[str, Any]
    method: str
    threads: int
    attention: Grid
    moe: Curve
    step_overhead: Curve
    dense: Curve | None = None
    serving_overhead: Curve | None = None

    def document(self) -> dict[str, Any]:
        """The JSON form :func:`parse_measured` reads back."""
        document: dict[str, Any] = {
            "model": dict(self.model),
            "method": self.method,
            "threads": self.threads,
            "attention": {
                "batches": list(self.attention.batches),
                "contexts": list(self.attention.contexts),
                "seconds": [list(row) for row in self.attention.seconds],
            },
            "moe": {"tokens": list(self.moe.xs), "seconds": list(self.moe.ys)},
            "step_overhead": {
                "batches": list(self.step_overhead.xs),
                "seconds": list(self.step_overhead.ys),
            },
        }
        if self.dense is not None:
            document["dense"] = {"tokens": list(self.dense.xs), "seconds": list(self.dense.ys)}
        if self.serving_overhead is not None:
            document["serving_overhead"] = {
                "batches": list(self.serving_overhead.xs),
                "seconds": list(self.serving_overhead.ys),
            }
        return document


def parse_measured(value: Any, where: str) -> MeasuredTables:
    """The tables in a profile's ``measured`` object; AFDConfigError on any problem."""
    value = json_object(value, where, _KEYS)
    model = value.get("model")
    if not isinstance(model, dict) or not model:
        raise AFDConfigError(f"{where}: model must be the measured model's fingerprint object")
    threads = value.get("threads")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise AFDConfigError(f"{where}: threads is {threads!r}; it must be an integer >= 1")
    method = value.get("method")
    if not isinstance(method, str) or not method:
        raise AFDConfigError(f"{where}: method must say how the times were taken")
    dense = value.get("dense")
    serving = value.get("serving_overhead")
    return MeasuredTables(
        model=model,
        method=method,
        threads=threads,
        attention=_grid(value.get("attention"), f"{where}: attention"),
        moe=_curve(value.get("moe"), "tokens", f"{where}: moe"),
        step_overhead=_curve(value.get("step_overhead"), "batches", f"{where}: step_overhead"),
        dense=None if dense is None else _curve(dense, "tokens", f"{where}: dense"),
        serving_overhead=(
            None if serving is None else _curve(serving, "batches", f"{where}: serving_overhead")
        ),
    )


def _grid(value: Any, where: str) -> Grid:
    if not isinstance(value, dict) or set(value) != {"batches", "contexts", "seconds"}:
        raise AFDConfigError(f"{where} must be an object with batches, contexts and seconds")
    batches = _axis(value["batches"], f"{where}: batches", minimum=2)
    contexts = _axis(value["contexts"], f"{where}: contexts", minimum=1)
    rows = value["seconds"]
    if not isinstance(rows, list) or len(rows) != len(batches):
        raise AFDConfigError(f"{where}: seconds must hold one row per batch ({len(batches)})")
    seconds = tuple(
        _times(row, len(contexts), f"{where}: seconds row {i}") for i, row in enumerate(rows)
    )
    return Grid(batches, contexts, seconds)


def _curve(value: Any, axis: str, where: str) -> Curve:
    if not isinstance(value, dict) or set(value) != {axis, "seconds"}:
        raise AFDConfigError(f"{where} must be an object with {axis} and seconds")
    xs = _axis(value[axis], f"{where}: {axis}", minimum=2)
    return Curve.through(xs, _times(value["seconds"], len(xs), f"{where}: seconds"))


def _axis(value: Any, where: str, minimum: int) -> tuple[int, ...]:
    ok = isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value
    )
    if not ok or len(value) < minimum or any(b <= a for a, b in itertools.pairwise(value)):
        raise AFDConfigError(
            f"{where} must be at least {minimum} positive integers in increasing order, "
            f"got {value!r}"
        )
    return tuple(value)


def _times(value: Any, count: int, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != count or not all(_is_time(v) for v in value):
        raise AFDConfigError(f"{where} must be {count} positive numbers of seconds")
    return tuple(float(v) for v in value)


def _is_time(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (math.isfinite(value) and value > 0)
    )


def build_tables(
    model: Mapping[str, Any],
    method: str,
    threads: int,
    attention: Mapping[tuple[int, int], float],
    moe: Mapping[int, float],
    step_overhead: Mapping[int, float],
    dense: Mapping[int, float] | None = None,
    serving_overhead: Mapping[int, float] | None = None,
) -> MeasuredTables:
    """Tables from timings keyed by (batch, context), tokens and batch (``afd measure``).

    Raises AFDConfigError when the attention timings do not cover every (batch, context)
    pair of their batches and contexts.
    """
    batches = sorted({b for b, _ in attention})
    contexts = sorted({c for _, c in attention})
    missing = [(b, c) for b in batches for c in contexts if (b, c) not in attention]
    if missing:
        raise AFDConfigError(f"measured attention lacks (batch, context) {missing[0]}")
    grid = Grid(
        tuple(batches),
        tuple(contexts),
        tuple(tuple(attention[b, c] for c in contexts) for b in batches),
    )
    return MeasuredTables(
        model=dict(model),
        method=method,
        threads=threads,
        attention=grid,
        moe=_sorted_curve(moe),
        step_overhead=_sorted_curve(step_overhead),
        dense=None if not dense else _sorted_curve(dense),
        serving_overhead=None if not serving_overhead else _sorted_curve(serving_overhead),
    )


def _sorted_curve(points: Mapping[int, float]) -> Curve:
    xs: Sequence[int] = sorted(points)
    return Curve.through(xs, [points[x] for x in xs])
