"""afd-connectors-npu's AFD plugin: the Ascend connectors (``afd`` entry point).

Importing this module imports no torch: the connector classes stay ``"module:Class"``
strings until the registry loads one.
"""

from __future__ import annotations

from afd_core.hookspecs import hookimpl
from afd_core.specs import ConnectorSpec


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """``CAMP2pAFDConnector``: on NPU (the Ascend kernels, when built) and on CPU (the
    reference kernels of afd-ascend-ops)."""
    return [
        ConnectorSpec(
            name="CAMP2pAFDConnector",
            target="afd_connectors_npu.connector:CAMP2pAFDConnector",
            platforms=("npu", "cpu"),
            gate_on_attention=False,
            gate_reason="moves hidden states only (its ops carry no routing), so the gate runs "
            "on the FFN role",
            description="P2P block exchange; a2e/e2a ops move the data (gate on FFN)",
        ),
    ]
