"""A plan as ``afd plan`` prints it: a JSON document for tools, or lines for people."""

from __future__ import annotations

from typing import Any

from afd_core.plan.memory import Memory
from afd_core.plan.model_shape import ModelShape
from afd_core.plan.profile import HardwareProfile
from afd_core.plan.search import SLO, Choice, Plan, Space
from afd_core.plan.step import AFDDeployment, LayerTime

GB = 1e9


def plan_document(
    plan: Plan, shape: ModelShape, profile: HardwareProfile, slo: SLO, space: Space
) -> dict[str, Any]:
    """The plan as plain data (``afd plan --json``); times in ms/us, memory in GB."""
    return {
        "model": shape.architecture,
        "profile": profile.name,
        "measured": profile.measured is not None,
        "devices": space.devices,
        "baseline_devices": space.baseline_devices or space.devices,
        "context": space.context,
        "slo": {
            "tpot_ms": slo.tpot_s * 1e3,
            "ttft_ms": None if slo.ttft_s is None else slo.ttft_s * 1e3,
        },
        "afd": _choice(plan.afd, plan.afd_reason),
        "monolithic": _choice(plan.monolithic, plan.monolithic_reason),
        "ratio": plan.ratio,
        "binding": plan.binding,
        "notes": list(plan.notes),
    }


def describe(
    plan: Plan, shape: ModelShape, profile: HardwareProfile, slo: SLO, space: Space
) -> str:
    """The plan in a few lines of text (``afd plan``)."""
    lines = [
        f"{shape.architecture} on {space.devices} x {profile.name}, context {space.context}, "
        f"TPOT <= {slo.tpot_s * 1e3:g} ms"
        + ("" if slo.ttft_s is None else f", TTFT <= {slo.ttft_s * 1e3:g} ms (prefill bound)")
        + (" (measured tables)" if profile.measured is not None else " (roofline)"),
    ]
    if plan.afd is None:
        lines.append(f"AFD: no deployment meets the bounds ({plan.afd_reason})")
    else:
        d = plan.afd.deployment
        assert isinstance(d, AFDDeployment)
        lines.append(
            f"AFD: {d.attention_ranks}A{d.ffn_ranks}F ({d.layout}), batch {d.batch} per "
            f"attention rank, {d.stages} stage{'s' if d.stages > 1 else ''}: " + _speed(plan.afd)
        )
        lines.append("  " + _layer(plan.afd.prediction.sparse_layer))
        for role, mem in plan.afd.prediction.memory.items():
            lines.append(f"  {role}: {_memory(mem)}")
    if plan.monolithic is None:
        lines.append(f"monolithic EP: no deployment meets the bounds ({plan.monolithic_reason})")
    else:
        d = plan.monolithic.deployment
        lines.append(
            f"monolithic EP{d.devices}: batch {d.batch} per device, {d.stages} "
            f"stage{'s' if d.stages > 1 else ''}: " + _speed(plan.monolithic)
        )
        lines.append("  " + _layer(plan.monolithic.prediction.sparse_layer))
        lines.append(f"  device: {_memory(plan.monolithic.prediction.memory['device'])}")
    if plan.ratio is not None:
        lines.append(f"AFD / monolithic tokens per second per device: {plan.ratio:.2f}x")
    lines.append(f"binding: {plan.binding}")
    lines.extend(f"note: {note}" for note in plan.notes)
    return "\n".join(lines)


def _choice(choice: Choice | None, reason: str) -> dict[str, Any] | None:
    if choice is None:
        return {"feasible": False, "reason": reason}
    p = choice.prediction
    layer = p.sparse_layer
    return {
        "feasible": True,
        "deployment": vars(choice.deployment),
        "tpot_ms": p.tpot_s * 1e3,
        "tokens_per_s": p.tokens_per_s,
        "tokens_per_s_per_device": p.tokens_per_s_per_device,
        "batch_limit": choice.batch_limit,
        "sparse_layer_us": {
            "attention": layer.attention.seconds * 1e6,
            "ffn": layer.ffn.seconds * 1e6,
            "exchange": layer.exchange.seconds * 1e6,
            "link": layer.link_s * 1e6,
            "layer": layer.seconds * 1e6,
        },
        "sparse_layer_bound": layer.bound,
        "outside_layers_ms": p.outside_layers_s * 1e3,
        "memory_gb": {
            role: {
                "weights": m.weights / GB,
                "kv_cache": m.kv_cache / GB,
                "activations": m.activations / GB,
                "total": m.total / GB,
            }
            for role, m in p.memory.items()
        },
    }


def _speed(choice: Choice) -> str:
    p = choice.prediction
    return (
        f"TPOT {p.tpot_s * 1e3:.2f} ms, {p.tokens_per_s_per_device:,.1f} tok/s per device "
        f"({p.tokens_per_s:,.0f} tok/s); batch stops at: {choice.batch_limit}"
    )


def _layer(layer: LayerTime) -> str:
    return (
        f"sparse layer {layer.seconds * 1e6:,.1f} us (per stage: attention "
        f"{layer.attention.seconds * 1e6:,.1f}, FFN {layer.ffn.seconds * 1e6:,.1f}, exchange "
        f"{layer.exchange.seconds * 1e6:,.1f}, link {layer.link_s * 1e6:,.1f}); set by "
        f"{layer.bound}"
    )


def _memory(mem: Memory) -> str:
    return (
        f"{mem.total / GB:,.2f} GB (weights {mem.weights / GB:,.2f}, KV cache "
        f"{mem.kv_cache / GB:,.2f}, activations {mem.activations / GB:,.2f})"
    )
