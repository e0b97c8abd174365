"""The module named by this package's ``afd`` entry point (imports nothing heavy)."""

from __future__ import annotations

from afd_core import hookimpl
from afd_core.plugins.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """Register ``DelayedGlooP2pConnector`` (CPU only: the delay copies host tensors)."""
    return [
        ConnectorSpec(
            name="DelayedGlooP2pConnector",
            target="afd_delay_plugin.connector:DelayedGlooP2pConnector",
            platforms=("cpu",),
            description="Benchmark only: P2P over gloo, every data message held delay_us",
        )
    ]
