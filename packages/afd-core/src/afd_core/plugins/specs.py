"""What a plugin contributes: connectors, role workers and model wrappers.

Specs name their implementation lazily as ``"module:Class"``, so building a registry
imports no heavy backend (no CUDA, no NPU code at plugin load).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

from afd_core.errors import AFDInstallError
from afd_core.topology import Role

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
    """A connector class known to the registry: the ``name`` users put in
    ``"connector"``, its lazy ``target`` (``"module:Class"``), the ``platforms`` it runs on
    and a one-line ``description`` (``afd check`` prints it).

    Nothing else: what the connector pairs and carries is its class's
    (:attr:`~afd_core.connector.Connector.pattern_type`,
    :attr:`~afd_core.connector.Connector.capabilities`; :mod:`afd_core.capabilities`).
    """

    name: str
    target: str
    platforms: tuple[Platform, ...]
    description: str = ""

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
