"""The planner: the AFD deployment on N devices with the most tokens per second per device
under a TPOT bound, and monolithic vLLM with expert parallelism on the same N devices.

For each layout, each split of N into A attention ranks and F = N - A FFN ranks (P2P:
A >= F) and each stage count, the batch per attention rank is the largest that keeps
every role within its usable memory and the predicted TPOT within the bound (TPOT never
falls as the batch grows, so a bisection finds it); the best of these wins (ties: fewer
stages, then P2P, then fewer FFN ranks). Monolithic vLLM gets the same treatment over
its batch per device and stage count (two stages only with more than one device: DBO
overlaps the all-to-all). Any of A, F, the batch or the stages can be fixed, to evaluate
one deployment (for example a published one) instead of searching.

A TTFT bound, when given, rejects deployments whose lone-prompt prefill (a lower bound of
TTFT, :meth:`LayerCosts.prefill` plus the exchanges) exceeds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from afd_core.errors import AFDConfigError
from afd_core.plan.costs import LayerCosts
from afd_core.plan.model_shape import ACTIVATION_BYTES, ModelShape
from afd_core.plan.profile import HardwareProfile
from afd_core.plan.step import (
    LAYOUTS,
    PAIRINGS,
    AFDDeployment,
    MonolithicDeployment,
    Prediction,
    predict_afd,
    predict_monolithic,
)

#: The largest batch per attention rank (or device) the planner considers by default.
DEFAULT_MAX_BATCH = 1024

Deployment = AFDDeployment | MonolithicDeployment


@dataclass(frozen=True)
class SLO:
    """The service level: seconds per output token, and optionally to the first token."""

    tpot_s: float
    ttft_s: float | None = None


@dataclass(frozen=True)
class Space:
    """What to search: ``devices`` in all, ``context`` cached tokens per sequence, and
    optionally fixed parts of the AFD deployment (``attention_ranks``, ``ffn_ranks``,
    ``batch``, ``stages``, ``layouts``) and of the baseline (``baseline_batch``;
    ``baseline_stages``; ``baseline_devices``: the devices of one monolithic replica,
    default ``devices``: since tokens per second per device are compared, replicas stand
    for the rest)."""

    devices: int
    context: int
    layouts: tuple[str, ...] = LAYOUTS
    attention_ranks: int | None = None
    ffn_ranks: int | None = None
    batch: int | None = None
    stages: tuple[int, ...] = (1, 2)
    baseline_batch: int | None = None
    baseline_devices: int | None = None
    baseline_stages: tuple[int, ...] = (1, 2)
    max_batch: int = DEFAULT_MAX_BATCH


@dataclass(frozen=True)
class Choice:
    """A deployment, its predicted step, and what stopped its batch from growing:
    ``"TPOT"``, ``"attention memory"``, ``"FFN memory"``, ``"device memory"``,
    ``"batch cap"`` or ``"fixed"``."""

    deployment: AFDDeployment | MonolithicDeployment
    prediction: Prediction
    batch_limit: str


@dataclass(frozen=True)
class Plan:
    """The best AFD deployment and the monolithic baseline (None, with the reason, when
    nothing meets the bounds), and the ratio of their tokens per second per device."""

    afd: Choice | None
    monolithic: Choice | None
    afd_reason: str = ""
    monolithic_reason: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def ratio(self) -> float | None:
        """AFD's tokens per second per device over monolithic vLLM's."""
        if self.afd is None or self.monolithic is None:
            return None
        afd, mono = self.afd.prediction, self.monolithic.prediction
        return afd.tokens_per_s_per_device / mono.tokens_per_s_per_device

    @property
    def binding(self) -> str:
        """What limits the AFD plan: the memory that capped its batch, or what sets the
        layer time when the TPOT bound did."""
        if self.afd is None:
            return "none: no AFD deployment meets the bounds"
        limit = self.afd.batch_limit
        if limit in ("TPOT", "fixed"):
            return self.afd.prediction.sparse_layer.bound
        return limit


def plan(shape: ModelShape, profile: HardwareProfile, slo: SLO, space: Space) -> Plan:
    """Search ``space`` for the best AFD deployment and the monolithic baseline.

    Raises AFDConfigError for a space that cannot hold one deployment (for example fixed
    ranks that do not add up to the devices) or a measured profile of another model.
    """
    _check(space, slo)
    costs = LayerCosts(shape, profile)
    usable = profile.device.usable_memory_bytes
    afd, afd_reason = _best_afd(shape, costs, slo, space, usable)
    mono, mono_reason = _best_monolithic(shape, costs, slo, space, usable)
    return Plan(afd, mono, afd_reason, mono_reason, _notes(profile, afd, mono))


def _best_afd(
    shape: ModelShape, costs: LayerCosts, slo: SLO, space: Space, usable: float
) -> tuple[Choice | None, str]:
    if space.devices < 2:
        return None, "AFD needs at least 2 devices (one attention rank, one FFN rank)"
    if slo.ttft_s is not None and _afd_ttft(shape, costs, space.context) > slo.ttft_s:
        return None, "the TTFT bound is below the prefill of one prompt"

    def predict(d: Deployment) -> Prediction:
        assert isinstance(d, AFDDeployment)
        return predict_afd(shape, costs, d, space.context)

    def memory_limit(p: Prediction) -> str | None:
        if p.memory["FFN rank"].total > usable:
            return "FFN memory"
        return "attention memory" if p.memory["attention rank"].total > usable else None

    makers = [
        _afd_maker(layout, a, f, m)
        for layout in space.layouts
        for a, f in _splits(space)
        if PAIRINGS[layout].refusal(a, f) is None
        for m in space.stages
    ]
    if not makers:
        return None, "P2P needs at least as many attention ranks as FFN ranks"
    return _best(makers, predict, memory_limit, slo, space.batch, space.max_batch, _afd_key)


def _best_monolithic(
    shape: ModelShape, costs: LayerCosts, slo: SLO, space: Space, usable: float
) -> tuple[Choice | None, str]:
    n = space.baseline_devices or space.devices
    if slo.ttft_s is not None and costs.prefill(space.context) > slo.ttft_s:
        return None, "the TTFT bound is below the prefill of one prompt"

    def predict(d: Deployment) -> Prediction:
        assert isinstance(d, MonolithicDeployment)
        return predict_monolithic(shape, costs, d, space.context)

    def memory_limit(p: Prediction) -> str | None:
        return "device memory" if p.memory["device"].total > usable else None

    stages = [m for m in space.baseline_stages if m == 1 or n > 1] or [1]
    makers = [partial(MonolithicDeployment, n, stages=m) for m in stages]
    return _best(
        makers, predict, memory_limit, slo, space.baseline_batch, space.max_batch, _throughput
    )


def _afd_maker(layout: str, a: int, f: int, stages: int) -> Callable[[int], Deployment]:
    """The AFD deployment of this layout, split and stage count at a given batch."""
    return partial(AFDDeployment, layout, a, f, stages=stages)


def _best(
    makers: list[Callable[[int], Deployment]],
    predict: Callable[[Deployment], Prediction],
    memory_limit: Callable[[Prediction], str | None],
    slo: SLO,
    fixed: int | None,
    max_batch: int,
    key: Callable[[Choice], Any],
) -> tuple[Choice | None, str]:
    """The best of the makers' deployments at their largest feasible batch, or None and
    every reason none was feasible."""
    best: Choice | None = None
    reasons: set[str] = set()
    for make in makers:
        choice, why = _largest_batch(make, predict, memory_limit, slo, fixed, max_batch)
        reasons.add(why)
        if choice is not None and (best is None or key(choice) > key(best)):
            best = choice
    if best is None:
        return None, "; ".join(sorted(r for r in reasons if r))
    return best, ""


def _largest_batch(
    make: Callable[[int], Deployment],
    predict: Callable[[Deployment], Prediction],
    memory_limit: Callable[[Prediction], str | None],
    slo: SLO,
    fixed: int | None,
    max_batch: int,
) -> tuple[Choice | None, str]:
    """The deployment at the largest feasible batch, or None and why there is none.

    Feasible: within memory and the TPOT bound, and at least one sequence per stage.
    Both fail only from some batch on, so a bisection between 1 and ``max_batch`` finds
    the edge.
    """
    seen: dict[int, tuple[str | None, Prediction]] = {}

    def check(b: int) -> tuple[str | None, Prediction]:
        if b not in seen:
            p = predict(make(b))
            limit = memory_limit(p)
            seen[b] = (limit or ("TPOT" if p.tpot_s > slo.tpot_s else None), p)
        return seen[b]

    stages = make(1).stages
    low = fixed if fixed is not None else stages
    if low < stages:
        return None, f"batch {low} cannot fill {stages} stages"
    limit, p = check(low)
    if limit is not None:
        return None, f"{limit} exceeded at batch {low}"
    if fixed is not None:
        return Choice(make(low), p, "fixed"), ""
    high = max_batch
    if high <= low or check(high)[0] is None:
        top = max(low, high)
        return Choice(make(top), check(top)[1], "batch cap"), ""
    while high - low > 1:  # check(low) passes, check(high) fails
        mid = (low + high) // 2
        if check(mid)[0] is None:
            low = mid
        else:
            high = mid
    return Choice(make(low), check(low)[1], check(high)[0] or "TPOT"), ""


def _splits(space: Space) -> list[tuple[int, int]]:
    n, a, f = space.devices, space.attention_ranks, space.ffn_ranks
    if a is not None and f is not None:
        return [(a, f)]
    if a is not None:
        return [(a, n - a)]
    if f is not None:
        return [(n - f, f)]
    return [(a, n - a) for a in range(1, n)]


def _check(space: Space, slo: SLO) -> None:
    if slo.tpot_s <= 0 or (slo.ttft_s is not None and slo.ttft_s <= 0):
        raise AFDConfigError("the TPOT and TTFT bounds must be positive")
    if min(space.devices, space.context, space.max_batch, space.baseline_devices or 1) < 1:
        raise AFDConfigError("devices, context and the batch cap must be at least 1")
    a, f = space.attention_ranks, space.ffn_ranks
    if a is not None and f is not None and a + f != space.devices:
        raise AFDConfigError(
            f"{a} attention ranks and {f} FFN ranks make {a + f} devices, not "
            f"{space.devices}; fix one of them or give --gpus {a + f}"
        )
    for name, value in (("attention ranks", a), ("FFN ranks", f)):
        if value is not None and not 1 <= value < space.devices:
            raise AFDConfigError(
                f"{name} must be in 1..{space.devices - 1} on {space.devices} devices, got {value}"
            )
    for stages in (space.stages, space.baseline_stages):
        if not set(stages) <= {1, 2} or not stages:
            raise AFDConfigError(f"stages must be 1 or 2, got {stages}")
    if not set(space.layouts) <= set(LAYOUTS) or not space.layouts:
        raise AFDConfigError(f"layouts must be among {', '.join(LAYOUTS)}, got {space.layouts}")


def _afd_ttft(shape: ModelShape, costs: LayerCosts, context: int) -> float:
    wire = context * shape.hidden_size * ACTIVATION_BYTES
    return costs.prefill(context) + shape.num_layers * costs.transfer(wire).seconds


def _throughput(choice: Choice) -> float:
    return choice.prediction.tokens_per_s_per_device


def _afd_key(choice: Choice) -> tuple[float, int, bool, int]:
    d = choice.deployment
    assert isinstance(d, AFDDeployment)
    return (_throughput(choice), -d.stages, d.layout == "p2p", -d.ffn_ranks)


def _notes(profile: HardwareProfile, afd: Choice | None, mono: Choice | None) -> tuple[str, ...]:
    """What the reader should know: extrapolated tables, the two-stage settings."""
    notes = []
    tables = profile.measured
    if tables is not None:
        largest = tables.attention.batches[-1]
        for name, choice in (("AFD", afd), ("monolithic", mono)):
            if choice is not None and choice.deployment.batch > largest:
                notes.append(
                    f"{name} batch {choice.deployment.batch} is beyond the largest measured "
                    f"batch ({largest}): its attention time is extrapolated"
                )
    if afd is not None and isinstance(afd.deployment, AFDDeployment) and afd.deployment.stages == 2:
        notes.append(
            "two stages: set num_stages 2 and stage_decode_token_threshold at most "
            f"{afd.deployment.batch} (the default, 32, keeps smaller batches in one stage)"
        )
    return tuple(notes)
