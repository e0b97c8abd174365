"""The AFD plugin hooks (pluggy project ``"afd"``, entry-point group ``afd``).

A plugin is a module (or any object) with functions decorated by :data:`hookimpl` whose
names match the specs below. Its distribution announces it with an entry point::

    [project.entry-points.afd]
    my_plugin = "my_package.hooks"

afd-core's own connectors go through the very same hooks (``afd_core.plugins.builtin_hooks``).
Every spec docstring is the whole contract of that hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from afd_core.config import AFDConfig
    from afd_core.plugins.specs import ConnectorSpec, ModelSpec, WorkerSpec

#: Marks a function as a hook specification of the ``afd`` project.
hookspec = pluggy.HookspecMarker("afd")
#: Marks a function as an implementation of an ``afd`` hook (plugins use this).
hookimpl = pluggy.HookimplMarker("afd")


@hookspec
def afd_connectors() -> list[ConnectorSpec]:
    """Return the connectors this plugin provides.

    Called once per process when the registry is first built (``get_registry()``), in
    every process that loads AFD plugins. Must be cheap and must not import the connector
    classes: each :class:`~afd_core.plugins.specs.ConnectorSpec` names its class lazily as
    ``"module:Class"``. A connector name already returned by another plugin makes the
    registry raise :class:`~afd_core.errors.AFDInstallError` naming both plugins.
    Return an empty list (or omit the hook) to contribute nothing.
    """


@hookspec
def afd_workers() -> list[WorkerSpec]:
    """Return the vLLM worker classes this plugin provides, one per (role, platform).

    Called once per process when the registry is first built. ``worker_cls="auto"`` of an
    AFD deployment resolves to the worker registered for its role and the current
    platform; an explicit ``worker_cls`` must be that class or a subclass of it. Two
    plugins registering the same (role, platform) make the registry raise
    :class:`~afd_core.errors.AFDInstallError`. Must not import the worker classes.
    """


@hookspec
def afd_models() -> list[ModelSpec]:
    """Return the role-aware model wrappers this plugin provides.

    Called once per process; every :class:`~afd_core.plugins.specs.ModelSpec` is registered with
    vLLM's ``ModelRegistry`` under its Hugging Face architecture name, replacing the stock
    class in every vLLM process. A wrapper must therefore behave exactly like the stock
    class when ``additional_config`` has no ``"afd"`` key. Two plugins claiming the same
    architecture make the registry raise :class:`~afd_core.errors.AFDInstallError`.
    """


@hookspec
def afd_validate(config: AFDConfig, vllm_config: Any) -> None:
    """Reject AFD deployments this plugin cannot serve.

    Called for every implementation, once, in the process that builds the vLLM config
    (the API server or offline ``LLM`` process), after the role's ``worker_cls`` has been
    resolved and vLLM's platform has checked the config; never called when AFD is off.
    ``vllm_config`` is vLLM's ``VllmConfig`` and may be modified in place (for example to
    turn off a feature the role cannot support). Return ``None``; raise
    :class:`~afd_core.errors.AFDConfigError` with a message that says what to change for
    an unsupported combination of AFD settings and vLLM settings.
    """
