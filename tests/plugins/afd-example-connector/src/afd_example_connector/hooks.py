"""The plugin module named by this package's ``afd`` entry point.

It imports nothing heavy: the connector classes are named as ``"module:Class"`` and only
imported when a deployment selects them.
"""

from __future__ import annotations

from afd_core import hookimpl
from afd_core.plugins.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """Register this package's three connectors (no CUDA graphs)."""
    return [
        ConnectorSpec(
            name="ExampleLoopbackConnector",
            target="afd_example_connector.connector:ExampleLoopbackConnector",
            platforms=("cpu", "cuda", "npu"),
            description="In-process loopback; an example for connector authors",
        ),
        ConnectorSpec(
            name="ExampleGlooP2pConnector",
            target="afd_example_connector.gloo_p2p:ExampleGlooP2pConnector",
            platforms=("cpu", "cuda", "npu"),
            description="A recipe: one world, gloo data plane with a byte counter, P2P block",
        ),
        ConnectorSpec(
            name="ExampleKitPatternConnector",
            target="afd_example_connector.kit_block:ExampleKitPatternConnector",
            platforms=("cpu",),
            description="A pattern of its own on afd-core's kit: block pairing, MessageChannel",
        ),
    ]
