"""afd-connectors-gpu's AFD plugin: the CUDA connectors (``afd`` entry point).

Importing this module imports no torch: the connector classes stay ``"module:Class"``
strings until the registry loads one.
"""

from __future__ import annotations

from afd_core.plugins.hookspecs import hookimpl
from afd_core.plugins.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """The NCCL P2P connector (eager and CUDA graphs: NONE, FULL, FULL_DECODE_ONLY) and the
    expert-routed M:N connector (eager; NCCL on CUDA, gloo elsewhere)."""
    return [
        ConnectorSpec(
            name="P2pNcclAFDConnector",
            target="afd_connectors_gpu.p2p_nccl:P2pNcclAFDConnector",
            platforms=("cuda",),
            description="Point-to-point connector: gloo control plane, NCCL data plane",
        ),
        ConnectorSpec(
            name="ExpertRoutedAFDConnector",
            target="afd_connectors_gpu.expert_routed:ExpertRoutedAFDConnector",
            platforms=("cpu", "cuda"),
            description="Expert-routed M:N: routed experts split over the FFN ranks",
        ),
        # Its name until afd-connectors-gpu 0.3 (it never used DeepEP); kept so that
        # existing configs still start.
        ConnectorSpec(
            name="DeepEPM2NAFDConnector",
            target="afd_connectors_gpu.expert_routed:ExpertRoutedAFDConnector",
            platforms=("cpu", "cuda"),
            description="Former name of ExpertRoutedAFDConnector (no DeepEP inside)",
        ),
    ]
