"""afd-core's own plugin: the reference connector, registered like any third-party one.

Loaded through afd-core's ``afd`` entry point (``afd_core = "afd_core.plugins.builtin_hooks"``),
so ``AFD_PLUGINS`` filters it exactly as it filters other plugins.
"""

from __future__ import annotations

from afd_core.plugins.hookspecs import hookimpl
from afd_core.plugins.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """The gloo P2P connector: runs wherever torch.distributed's gloo backend does."""
    return [
        ConnectorSpec(
            name="P2pGlooAFDConnector",
            target="afd_core.connectors.gloo:P2pGlooAFDConnector",
            platforms=("cpu", "cuda", "npu"),
            description="Reference point-to-point connector over torch.distributed gloo",
        )
    ]
