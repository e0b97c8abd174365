"""afd-connectors-gpu's AFD plugin: the CUDA connectors (``afd`` entry point).

Importing this module imports no torch: the connector classes stay ``"module:Class"``
strings until the registry loads one.
"""

from __future__ import annotations

from afd_core.hookspecs import hookimpl
from afd_core.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """The NCCL P2P connector (eager and CUDA graphs: NONE, FULL, FULL_DECODE_ONLY)."""
    return [
        ConnectorSpec(
            name="P2pNcclAFDConnector",
            target="afd_connectors_gpu.p2p_nccl:P2pNcclAFDConnector",
            platforms=("cuda",),
            supports_cuda_graphs=True,
            description="Point-to-point connector: gloo control plane, NCCL data plane",
        )
    ]
