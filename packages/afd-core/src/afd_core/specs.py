"""What a plugin contributes: connectors, role workers and model wrappers.

Specs name their implementation lazily as ``"module:Class"``, so building a registry
imports no heavy backend (no CUDA, no NPU code at plugin load).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

from afd_core.errors import AFDInstallError
from afd_core.placement import PlacementRule
from afd_core.topology import ExchangePattern, Role

Platform = Literal["cpu", "cuda", "npu"]
PLATFORMS: tuple[Platform, ...] = ("cpu", "cuda", "npu")


def load_target(target: str) -> Any:
    """Import ``"package.module:Attribute"`` and return the attribute.

    Raises AFDInstallError naming the module when it cannot be imported.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"AFD plugin target {target!r} must look like 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AFDInstallError(
            f"AFD: cannot import {module_name!r} for {target!r}: {exc}. Install the package "
            "that provides it (see `pip show` of the plugin that registered it)"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise AFDInstallError(f"AFD: module {module_name!r} has no attribute {attr!r}") from exc


@dataclass(frozen=True)
class ConnectorSpec:
    """A connector class known to the registry.

    ``platforms``: where it can run. ``requires_async_dp``: the connector only works with
    ``async_dp=true`` (and ``async_dp=true`` is only valid with such a connector).
    ``supports_cuda_graphs``: its data plane can be captured in a CUDA graph.
    ``exchange``: the rank map its FFN ranks need (:mod:`afd_core.topology`):
    ``"block"`` (every FFN rank holds every expert) or ``"expert"`` (routed experts split
    over the FFN ranks), and with ``"expert"`` ``expert_placement``, the rule that splits
    them (:mod:`afd_core.placement`). ``gate_on_attention``: None when the connector takes
    either gate placement, else the ``compute_gate_on_attention`` it requires,
    ``gate_reason`` saying why (config validation and ``afd check`` refuse the other value
    with it).
    """

    name: str
    target: str
    platforms: tuple[Platform, ...]
    requires_async_dp: bool = False
    supports_cuda_graphs: bool = False
    description: str = ""
    exchange: ExchangePattern = "block"
    expert_placement: PlacementRule = "balanced"
    gate_on_attention: bool | None = None
    gate_reason: str = ""

    def load(self) -> type:
        """Import and return the connector class."""
        return load_target(self.target)


@dataclass(frozen=True)
class WorkerSpec:
    """The vLLM worker class that runs ``role`` on ``platform``.

    ``distribution`` is the pip package that ships it; error messages name it.
    """

    role: Role
    platform: Platform
    target: str
    distribution: str


@dataclass(frozen=True)
class ModelSpec:
    """A role-aware model wrapper registered with vLLM under a Hugging Face architecture."""

    architecture: str
    target: str
