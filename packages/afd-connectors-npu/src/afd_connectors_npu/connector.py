"""``CAMP2pAFDConnector``: P2P block exchange with the ``a2e``/``e2a`` ops as data plane.

Its recipe (:mod:`afd_core.assembly`): one world of every rank (the op groups span it),
steps announced by the attention ranks on afd-core's control channel, an op plane whose
provider opens one group per stage, the CAM P2P pattern
(:mod:`afd_connectors_npu.cam_p2p`). On CPU the provider is afd-ascend-ops' reference
provider (gloo groups, the reference kernels); an NPU provider (HCCL groups, the Ascend
kernels) is not built yet, and no Ascend hardware is available to this project.

Rules: the gate runs on the FFN role (``compute_gate_on_attention`` must be false: the
ops carry no routing; its registration says so, so config validation and ``afd check``
refuse true); ``connector_extra_config`` takes ``core_num``, ``attn_core_num``,
``ffn_core_num`` and ``quant_mode`` (0), see :mod:`afd_connectors_npu.extra_config`.
Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from afd_connectors_npu.cam_p2p import CamP2p
from afd_connectors_npu.extra_config import CamExtraConfig
from afd_core.assembly import Control, Layout, OpPlane, Recipe
from afd_core.connector import Connector

if TYPE_CHECKING:
    from afd_core.op_provider import OpProvider

#: Op groups the provider opens: one per stage of a step (two-stage steps need two).
NUM_STAGES = 2


class CAMP2pAFDConnector(Connector):
    """AFD connector: one world, announced steps, ``a2e``/``e2a`` op plane, CAM P2P."""

    name = "CAMP2pAFDConnector"

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> CamExtraConfig:
        """Accept the CAM keys (see :class:`~afd_connectors_npu.extra_config.CamExtraConfig`)."""
        return CamExtraConfig.parse(raw, cls.name)

    def recipe(self) -> Recipe:
        """One world, announced steps, the op plane, the CAM P2P pattern."""
        extra: CamExtraConfig = self.extra
        cores = {role: extra.cores_of(role) for role in ("attention", "ffn")}
        plane = OpPlane(reference_provider, NUM_STAGES)
        return Recipe(Layout.WORLD, Control.ANNOUNCED, plane, CamP2p(cores))


def reference_provider() -> OpProvider:
    """afd-ascend-ops' CPU reference provider (imports torch and registers the ops)."""
    from afd_ascend_ops.reference import ReferenceOpProvider

    return ReferenceOpProvider()
