"""Hardware profiles: what one device and its link can do, as a versioned JSON file.

A profile is a roofline of named parts, optionally with measured tables of one model's
layers (written by ``afd measure``)::

    {
      "schema": "afd-hardware-profile", "version": 2,
      "name": "H100-SXM", "source": "where each number comes from",
      "device": {
        "peak_bf16_flops_per_s": 9.89e14, "peak_fp8_flops_per_s": 1.979e15,
        "hbm_bytes_per_s": 3.35e12, "memory_bytes": 8.0e10,
        "usable_memory_fraction": 0.92, "flops_efficiency": 0.6,
        "bandwidth_efficiency": 0.8, "layer_overhead_s": 1e-5, "step_overhead_s": 2e-3
      },
      "link": {"bytes_per_s": 4.5e11, "latency_s": 5e-6},
      "measured": {...}
    }

``peak_fp8_flops_per_s`` is optional (absent: 8-bit experts run at the bf16 peak);
``usable_memory_fraction`` defaults to vLLM's ``gpu_memory_utilization`` (0.92), the
efficiencies to 1, the overheads to 0. ``link.bytes_per_s`` is one direction of one
device's link. ``measured`` is described in :mod:`afd_core.plan.measured`. Version 2 added
``measured.serving_overhead``; version 1 files (without it) are still read. Unknown keys,
wrong types and non-positive numbers are errors naming the key: a typo must not silently
fall back to a default.

Presets ship in ``afd_core/plan/presets/`` (each states its sources): pass the name
instead of a path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from afd_core.errors import AFDConfigError
from afd_core.plan.measured import MeasuredTables, parse_measured
from afd_core.plan.strict_json import json_object

SCHEMA = "afd-hardware-profile"
VERSION = 2
#: The versions this afd reads: 1 lacks ``measured.serving_overhead``.
READABLE_VERSIONS = (1, 2)
#: vLLM 0.32's default ``gpu_memory_utilization`` (vllm/config/cache.py).
DEFAULT_USABLE_MEMORY_FRACTION = 0.92


@dataclass(frozen=True)
class Device:
    """One device's roofline. Rates are per second, sizes in bytes."""

    peak_bf16_flops_per_s: float
    hbm_bytes_per_s: float
    memory_bytes: float
    peak_fp8_flops_per_s: float | None = None
    usable_memory_fraction: float = DEFAULT_USABLE_MEMORY_FRACTION
    flops_efficiency: float = 1.0
    bandwidth_efficiency: float = 1.0
    layer_overhead_s: float = 0.0
    step_overhead_s: float = 0.0

    @property
    def usable_memory_bytes(self) -> float:
        """Memory a role may fill: weights, KV cache and activations."""
        return self.memory_bytes * self.usable_memory_fraction


@dataclass(frozen=True)
class Link:
    """One device's link to its peers, one direction."""

    bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class HardwareProfile:
    """A device, its link, and optionally measured tables of one model's layers."""

    name: str
    source: str
    device: Device
    link: Link
    measured: MeasuredTables | None = None


def preset_names() -> list[str]:
    """The names of the shipped presets."""
    folder = resources.files("afd_core.plan") / "presets"
    names = (p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))
    return sorted(names)


def load_profile(name_or_path: str) -> HardwareProfile:
    """The profile in the JSON file ``name_or_path``, or the preset of that name.

    Raises AFDConfigError naming the file and key on any problem.
    """
    path = Path(name_or_path)
    if path.is_file():
        text, source = path.read_text(encoding="utf-8"), str(path)
    elif name_or_path in preset_names():
        preset = resources.files("afd_core.plan") / "presets" / f"{name_or_path}.json"
        text, source = preset.read_text(encoding="utf-8"), f"preset {name_or_path}"
    else:
        raise AFDConfigError(
            f"profile {name_or_path!r} is neither a file nor a preset; pass a profile JSON "
            f"file or one of {', '.join(preset_names())}"
        )
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AFDConfigError(
            f"profile {source} is not valid JSON ({exc.msg} at line {exc.lineno})"
        ) from exc
    return parse_profile(document, source)


def parse_profile(document: Any, source: str = "profile") -> HardwareProfile:
    """The profile a parsed JSON document describes (see the module docstring)."""
    obj = json_object(
        document, source, {"schema", "version", "name", "source", "device", "link", "measured"}
    )
    if obj.get("schema") != SCHEMA:
        raise AFDConfigError(f"{source}: schema must be {SCHEMA!r}, got {obj.get('schema')!r}")
    version = obj.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise AFDConfigError(
            f"{source}: version {version!r} is not supported (this afd reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}); write the profile again with this "
            "version"
        )
    measured = obj.get("measured")
    if version == 1 and isinstance(measured, dict) and "serving_overhead" in measured:
        raise AFDConfigError(
            f"{source}: measured.serving_overhead needs version 2 (this file says 1); "
            "set version to 2"
        )
    device = json_object(obj.get("device"), f"{source}: device", set(Device.__dataclass_fields__))
    link = json_object(obj.get("link"), f"{source}: link", {"bytes_per_s", "latency_s"})
    return HardwareProfile(
        name=_text(obj, "name", source),
        source=_text(obj, "source", source),
        device=Device(
            peak_bf16_flops_per_s=_number(device, "peak_bf16_flops_per_s", source),
            hbm_bytes_per_s=_number(device, "hbm_bytes_per_s", source),
            memory_bytes=_number(device, "memory_bytes", source),
            peak_fp8_flops_per_s=_number(device, "peak_fp8_flops_per_s", source, None),
            usable_memory_fraction=_fraction(
                device, "usable_memory_fraction", source, DEFAULT_USABLE_MEMORY_FRACTION
            ),
            flops_efficiency=_fraction(device, "flops_efficiency", source, 1.0),
            bandwidth_efficiency=_fraction(device, "bandwidth_efficiency", source, 1.0),
            layer_overhead_s=_number(device, "layer_overhead_s", source, 0.0, zero_ok=True),
            step_overhead_s=_number(device, "step_overhead_s", source, 0.0, zero_ok=True),
        ),
        link=Link(
            bytes_per_s=_number(link, "bytes_per_s", f"{source}: link"),
            latency_s=_number(link, "latency_s", f"{source}: link", zero_ok=True),
        ),
        measured=None if measured is None else parse_measured(measured, f"{source}: measured"),
    )


def profile_document(profile: HardwareProfile) -> dict[str, Any]:
    """``profile`` as the JSON document :func:`parse_profile` reads back."""
    device = {k: v for k, v in vars(profile.device).items() if v is not None}
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "version": VERSION,
        "name": profile.name,
        "source": profile.source,
        "device": device,
        "link": {"bytes_per_s": profile.link.bytes_per_s, "latency_s": profile.link.latency_s},
    }
    if profile.measured is not None:
        document["measured"] = profile.measured.document()
    return document


def _text(obj: Mapping[str, Any], key: str, source: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise AFDConfigError(f"{source}: {key} must be a non-empty string, got {value!r}")
    return value


_MISSING = object()


def _number(
    obj: Mapping[str, Any], key: str, source: str, default: Any = _MISSING, zero_ok: bool = False
) -> Any:
    if key not in obj:
        if default is _MISSING:
            raise AFDConfigError(f"{source}: {key} is missing; add it (see docs/planning.md)")
        return default
    value = obj[key]
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not valid or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise AFDConfigError(f"{source}: {key} is {value!r}; it must be a number {bound}")
    return float(value)


def _fraction(obj: Mapping[str, Any], key: str, source: str, default: float) -> float:
    value = _number(obj, key, source, default)
    if value > 1:
        raise AFDConfigError(f"{source}: {key} is {value!r}; it must be in (0, 1]")
    return value
