"""The registry: what the installed AFD plugins provide, by name.

Built from the hooks of :mod:`afd_core.plugins.hookspecs` by calling each plugin's
implementation separately, so a clash names both plugins. Building it imports the hook
modules only: connector, worker and model classes stay ``"module:Class"`` strings until
someone calls ``spec.load()`` (the pattern of vLLM's KV connector factory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.plugins.manager import AFDPluginManager, get_plugin_manager, load_plugins
from afd_core.plugins.specs import PLATFORMS, ConnectorSpec, ModelSpec, Platform, WorkerSpec
from afd_core.topology import ROLES, Role

#: The distribution that ships the workers of each role.
ROLE_DISTRIBUTIONS: Mapping[Role, str] = MappingProxyType(
    {"attention": "afd-attention", "ffn": "afd-ffn"}
)
# Platforms whose vLLM comes through a pip extra of the role package (NPU deployments
# install vLLM-Ascend themselves).
_PLATFORM_EXTRAS: frozenset[str] = frozenset({"cpu", "cuda"})

_Spec = TypeVar("_Spec", ConnectorSpec, WorkerSpec, ModelSpec)


def install_hint(role: Role, platform: Platform) -> str:
    """The pip command that installs the ``role`` worker for ``platform``."""
    dist = ROLE_DISTRIBUTIONS[role]
    if platform in _PLATFORM_EXTRAS:
        return f"pip install '{dist}[{platform}]'"
    return f"pip install {dist}"


@dataclass(frozen=True)
class AFDRegistry:
    """A read-only view of the connectors, workers and models of the loaded plugins."""

    connectors: Mapping[str, ConnectorSpec]
    workers: Mapping[tuple[Role, Platform], WorkerSpec]
    models: Mapping[str, ModelSpec]

    @classmethod
    def from_plugin_manager(cls, pm: AFDPluginManager) -> AFDRegistry:
        """Collect the specs of every plugin registered with ``pm``.

        Raises AFDInstallError when a hook returns something other than a list of specs,
        when a spec names an unknown role or platform, or when two plugins register the
        same connector name, (role, platform) worker or model architecture.
        """
        return cls(
            connectors=_collect(pm, "afd_connectors", ConnectorSpec, lambda s: s.name),
            workers=_collect(pm, "afd_workers", WorkerSpec, lambda s: (s.role, s.platform)),
            models=_collect(pm, "afd_models", ModelSpec, lambda s: s.architecture),
        )

    def connector(self, name: str) -> ConnectorSpec:
        """The connector registered as ``name``.

        Raises AFDConfigError listing the registered names when there is none.
        """
        try:
            return self.connectors[name]
        except KeyError:
            registered = ", ".join(sorted(self.connectors)) or "none"
            raise AFDConfigError(
                f"AFD config: connector {name!r} is not registered (registered connectors: "
                f"{registered}); fix the name or install the package that provides it"
            ) from None

    def worker(self, role: Role, platform: Platform) -> WorkerSpec:
        """The worker registered for ``role`` on ``platform``.

        Raises AFDInstallError naming the package to install when there is none.
        """
        try:
            return self.workers[(role, platform)]
        except KeyError:
            elsewhere = sorted(p for r, p in self.workers if r == role)
            note = f" (installed {role} workers: {', '.join(elsewhere)})" if elsewhere else ""
            raise AFDInstallError(
                f"AFD: no {role} worker is installed for platform {platform!r}{note}; "
                f"install it with `{install_hint(role, platform)}`"
            ) from None


def _collect(
    pm: AFDPluginManager,
    hook_name: str,
    spec_type: type[_Spec],
    key: Callable[[_Spec], Hashable],
) -> Mapping[Any, _Spec]:
    found: dict[Hashable, _Spec] = {}
    owners: dict[Hashable, str] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        origin = pm.describe(impl.plugin_name)
        specs = impl.function()
        if not isinstance(specs, list | tuple) or not all(isinstance(s, spec_type) for s in specs):
            raise AFDInstallError(
                f"AFD: {hook_name}() of {origin} returned {specs!r}; it must return a list "
                f"of afd_core.plugins.specs.{spec_type.__name__}"
            )
        for spec in specs:
            _check_spec(spec, origin)
            k = key(spec)
            if k in found:
                raise AFDInstallError(
                    f"AFD: {spec_type.__name__} {k!r} is registered twice, by {owners[k]} and "
                    f"by {origin}; uninstall one of the two packages or leave one out of "
                    "AFD_PLUGINS"
                )
            found[k] = spec
            owners[k] = origin
    return MappingProxyType(found)


def _check_spec(spec: ConnectorSpec | WorkerSpec | ModelSpec, origin: str) -> None:
    """Reject role and platform names that no lookup would ever match."""
    if isinstance(spec, WorkerSpec) and spec.role not in ROLES:
        raise AFDInstallError(
            f"AFD: {origin} registers {spec!r} for role {spec.role!r}; roles are {', '.join(ROLES)}"
        )
    if isinstance(spec, ConnectorSpec):
        platforms = spec.platforms
    elif isinstance(spec, WorkerSpec):
        platforms = (spec.platform,)
    else:
        return
    unknown = [p for p in platforms if p not in PLATFORMS]
    if unknown:
        raise AFDInstallError(
            f"AFD: {origin} registers {spec!r} for platform {', '.join(map(repr, unknown))}; "
            f"platforms are {', '.join(PLATFORMS)}"
        )


_registry_lock = threading.Lock()
_registry: AFDRegistry | None = None


def get_registry() -> AFDRegistry:
    """The registry of this process: loads the plugins on first use, then cached."""
    global _registry
    with _registry_lock:
        if _registry is None:
            load_plugins()
            _registry = AFDRegistry.from_plugin_manager(get_plugin_manager())
        return _registry


def reset_registry() -> None:
    """Drop the cached registry, so the next :func:`get_registry` rebuilds it (for tests)."""
    global _registry
    with _registry_lock:
        _registry = None
