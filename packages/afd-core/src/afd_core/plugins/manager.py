"""Loading AFD plugins: one pluggy plugin manager per process, fed by the ``afd`` group.

Every installed distribution that declares an entry point in the ``afd`` group is a
plugin, afd-core itself included (``afd_core = "afd_core.plugins.builtin_hooks"``). The
environment variable ``AFD_PLUGINS`` restricts which entry points load: unset loads all,
a comma-separated list of entry-point names loads only those, an empty string loads none
(tests then register plugin objects directly with ``get_plugin_manager().register``).

A plugin that fails to import or does not fit the hook specs is an error, never skipped:
a silently missing connector or worker would only surface later as a confusing
"not registered" message.
"""

from __future__ import annotations

import os
import threading
from importlib.metadata import EntryPoint, entry_points

import pluggy

from afd_core.errors import AFDInstallError
from afd_core.plugins import hookspecs

#: The entry-point group (and pluggy project name) of AFD plugins.
ENTRY_POINT_GROUP = "afd"
#: Environment variable: comma-separated allow-list of entry-point names to load.
PLUGINS_ENV = "AFD_PLUGINS"


class AFDPluginManager(pluggy.PluginManager):
    """A pluggy manager with the AFD hook specs that remembers where each plugin came from."""

    def __init__(self) -> None:
        super().__init__(ENTRY_POINT_GROUP)
        self.add_hookspecs(hookspecs)
        self._origins: dict[str, str] = {}

    def describe(self, plugin_name: str) -> str:
        """Human-readable origin of a plugin, for error messages.

        ``"entry point 'x' (pkg.hooks) of distribution 'pkg'"`` for plugins loaded from
        entry points, ``"plugin 'x' (registered directly)"`` for the others.
        """
        return self._origins.get(plugin_name, f"plugin {plugin_name!r} (registered directly)")

    def register_entry_point(self, ep: EntryPoint) -> None:
        """Import ``ep`` and register what it points at under ``ep.name`` (idempotent).

        Raises AFDInstallError naming the entry point and its distribution when the import
        fails, when another distribution already registered that name, or when the plugin
        does not match the hook specs (wrong arguments, unknown hook names).
        """
        dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
        origin = f"entry point {ep.name!r} ({ep.value}) of distribution {dist!r}"
        if self._origins.get(ep.name) == origin:
            return
        if ep.name in self._origins:
            raise AFDInstallError(
                f"AFD: two installed packages define the {ENTRY_POINT_GROUP!r} entry point "
                f"{ep.name!r}: {self._origins[ep.name]} and {origin}; uninstall one of them"
            )
        try:
            plugin = ep.load()
        except Exception as exc:
            raise AFDInstallError(
                f"AFD: cannot load plugin {origin}: {type(exc).__name__}: {exc}. Reinstall "
                f"or upgrade {dist}, uninstall it, or leave it out of {PLUGINS_ENV}"
            ) from exc
        try:
            self.register(plugin, name=ep.name)
            self.check_pending()
        except (ValueError, pluggy.PluginValidationError) as exc:
            if self.is_registered(plugin):
                self.unregister(plugin)
            raise AFDInstallError(
                f"AFD: plugin {origin} does not fit the AFD hooks: {exc}. Its hook "
                "functions must be named and typed as in afd_core.plugins.hookspecs; fix or "
                f"upgrade {dist}"
            ) from exc
        self._origins[ep.name] = origin


# Reentrant: a plugin module may itself ask for the manager while it is being imported.
_lock = threading.RLock()
_pm: AFDPluginManager | None = None
_loaded = False


def get_plugin_manager() -> AFDPluginManager:
    """The process-wide plugin manager (created on first use, without loading plugins)."""
    global _pm
    with _lock:
        if _pm is None:
            _pm = AFDPluginManager()
        return _pm


def allowed_plugin_names() -> frozenset[str] | None:
    """The entry-point names ``AFD_PLUGINS`` allows, or ``None`` when it is unset (all)."""
    raw = os.environ.get(PLUGINS_ENV)
    if raw is None:
        return None
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def load_plugins() -> None:
    """Register every allowed ``afd`` entry point with the process-wide manager.

    Idempotent: only the first call in a process loads anything. Raises AFDInstallError
    when a plugin cannot be loaded (see :meth:`AFDPluginManager.register_entry_point`) or
    when ``AFD_PLUGINS`` names an entry point that no installed distribution provides.
    """
    global _loaded
    pm = get_plugin_manager()
    with _lock:
        if _loaded:
            return
        allowed = allowed_plugin_names()
        available = entry_points(group=ENTRY_POINT_GROUP)
        if allowed is not None:
            missing = sorted(allowed - set(available.names))
            if missing:
                raise AFDInstallError(
                    f"AFD: {PLUGINS_ENV} names {', '.join(missing)}, but no installed package "
                    f"has such an {ENTRY_POINT_GROUP!r} entry point (installed: "
                    f"{', '.join(sorted(available.names)) or 'none'}); fix {PLUGINS_ENV} or "
                    "install the package"
                )
        for ep in available:
            if allowed is None or ep.name in allowed:
                pm.register_entry_point(ep)
        _loaded = True


def reset_plugins() -> None:
    """Forget the process-wide manager and its plugins (for tests)."""
    global _pm, _loaded
    with _lock:
        _pm = None
        _loaded = False
