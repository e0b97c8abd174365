"""afd-connectors-npu's AFD plugin: the Ascend connectors (``afd`` entry point).

Importing this module imports no torch: the connector classes stay ``"module:Class"``
strings until the registry loads one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from afd_core.errors import AFDConfigError
from afd_core.plugins.hookspecs import hookimpl
from afd_core.plugins.specs import ConnectorSpec

if TYPE_CHECKING:
    from afd_core.config import AFDConfig


@hookimpl
def afd_connectors() -> list[ConnectorSpec]:
    """``CAMP2pAFDConnector`` and ``CAMAsyncAFDConnector``: on NPU (the Ascend kernels,
    when built) and on CPU (the reference kernels of afd-ascend-ops)."""
    return [
        ConnectorSpec(
            name="CAMP2pAFDConnector",
            target="afd_connectors_npu.connector:CAMP2pAFDConnector",
            platforms=("npu", "cpu"),
            description="P2P block exchange; a2e/e2a ops move the data (gate on FFN)",
        ),
        ConnectorSpec(
            name="CAMAsyncAFDConnector",
            target="afd_connectors_npu.connector:CAMAsyncAFDConnector",
            platforms=("npu", "cpu"),
            description="expert-routed dispatch/combine, no control plane; CAM async ops "
            "move the data (gate on attention, async DP)",
        ),
    ]


@hookimpl
def afd_validate(config: AFDConfig, vllm_config: Any) -> None:
    """CAM async runs eagerly: refuse its attention role with graphs or compilation on."""
    if config.connector != "CAMAsyncAFDConnector" or config.role != "attention":
        return
    if not vllm_config.model_config.enforce_eager:
        raise AFDConfigError(
            "AFD config: CAMAsyncAFDConnector runs eagerly (its deferred receive and "
            "work-item FFN loop are not captured in graphs); start the attention role with "
            "--enforce-eager"
        )
