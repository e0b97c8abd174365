"""Run vLLM servers locally: one server (:class:`VllmServer`) or an AFD deployment of
attention and FFN servers (:class:`LocalDeployment`), with bounded start-up and a stop
that leaves no process behind. ``afd launch`` and the demo are built on this package.
"""

from __future__ import annotations

from afd_core.tools.launch.deployment import (
    DEFAULT_CONNECTOR,
    DeploymentSpec,
    LocalDeployment,
    free_ports,
)
from afd_core.tools.launch.server import ServerError, ServerSpec, VllmServer

__all__ = [
    "DEFAULT_CONNECTOR",
    "DeploymentSpec",
    "LocalDeployment",
    "ServerError",
    "ServerSpec",
    "VllmServer",
    "free_ports",
]
