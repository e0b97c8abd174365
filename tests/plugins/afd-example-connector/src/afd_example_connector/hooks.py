"""The plugin module named by this package's ``afd`` entry point.

It imports nothing heavy: the connector class is named as ``"module:Class"`` and only
imported when a deployment selects it.
"""

from __future__ import annotations

from afd_core import hookimpl
from afd_core.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """Register ExampleLoopbackConnector (runs wherever torch runs, no CUDA graphs)."""
    return [
        ConnectorSpec(
            name="ExampleLoopbackConnector",
            target="afd_example_connector.connector:ExampleLoopbackConnector",
            platforms=("cpu", "cuda", "npu"),
            description="In-process loopback; an example for connector authors",
        )
    ]
