"""The Ascend connectors, each a recipe (:mod:`afd_core.assembly`) and its config parsing.

``CAMP2pAFDConnector``: P2P block exchange with the ``a2e``/``e2a`` ops as data plane. Its
recipe (:mod:`afd_core.assembly`): one world of every rank (the op groups span it),
steps announced by the attention ranks on afd-core's control channel, an op plane whose
provider opens one group per stage, the CAM P2P pattern
(:mod:`afd_connectors_npu.cam_p2p`). The provider follows the platform
(:mod:`afd_connectors_npu.providers`): afd-ascend-ops' reference provider (gloo groups,
the reference kernels) on CPU, its HCCL provider and compiled kernels on Ascend NPU
(hardware-unverified: no Ascend device was available to this project).

Rules: the gate runs on the FFN role (``compute_gate_on_attention`` must be false: the
ops carry no routing; its registration says so, so config validation and ``afd check``
refuse true); ``connector_extra_config`` takes ``core_num``, ``attn_core_num``,
``ffn_core_num`` and ``quant_mode`` (0), see :mod:`afd_connectors_npu.extra_config`.

``CAMAsyncAFDConnector``: expert-routed dispatch and combine with the CAM async ops as
data plane (:mod:`afd_connectors_npu.cam_async`). Its recipe: one world, **no** control
plane (the data carries its own counts), an op plane of two groups (one per stage), the
CAM async pattern. Rules, each checked at start-up: ``async_dp`` true and
``compute_gate_on_attention`` true (its registration requires both), eager execution
(the attention role's ``enforce_eager``), both roles' ``max_num_batched_tokens`` equal
(it sizes the ops' buffers; it travels in the wire spec, so the rendezvous compares it);
``connector_extra_config`` takes the CAM keys and ``async_moe_ubatching`` (two stages per
step when true; ``num_stages`` follows from it).

Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from afd_connectors_npu.cam_async import CamAsync
from afd_connectors_npu.cam_p2p import CamP2p
from afd_connectors_npu.extra_config import CamAsyncExtraConfig, CamExtraConfig
from afd_connectors_npu.providers import cam_async_provider, cam_p2p_provider
from afd_core.assembly import Control, Layout, OpPlane, Recipe
from afd_core.connector import Connector

#: Op groups the provider opens: one per stage of a step (two-stage steps need two).
NUM_STAGES = 2


class CAMP2pAFDConnector(Connector):
    """AFD connector: one world, announced steps, ``a2e``/``e2a`` op plane, CAM P2P."""

    name = "CAMP2pAFDConnector"
    pattern_type = CamP2p

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> CamExtraConfig:
        """Accept the CAM keys (see :class:`~afd_connectors_npu.extra_config.CamExtraConfig`)."""
        return CamExtraConfig.parse(raw, cls.name)

    def recipe(self) -> Recipe:
        """One world, announced steps, the op plane, the CAM P2P pattern."""
        extra: CamExtraConfig = self.extra
        cores = {role: extra.cores_of(role) for role in ("attention", "ffn")}
        plane = OpPlane(cam_p2p_provider, NUM_STAGES)
        return Recipe(Layout.WORLD, Control.ANNOUNCED, plane, CamP2p(cores))


class CAMAsyncAFDConnector(Connector):
    """AFD connector: one world, in-band counts, the CAM async op plane, expert-routed."""

    name = "CAMAsyncAFDConnector"
    pattern_type = CamAsync
    sized_by_max_num_batched_tokens = True

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> CamAsyncExtraConfig:
        """Accept the CAM keys and ``async_moe_ubatching`` (see
        :class:`~afd_connectors_npu.extra_config.CamAsyncExtraConfig`)."""
        return CamAsyncExtraConfig.parse(raw, cls.name)

    @classmethod
    def stages_fixed_by(cls, extra: CamAsyncExtraConfig) -> int:
        """``async_moe_ubatching`` decides the stages per step: 2 when true, else 1."""
        return extra.num_stages

    def recipe(self) -> Recipe:
        """One world, no announcements, the async op plane, the CAM async pattern."""
        plane = OpPlane(cam_async_provider, NUM_STAGES)
        return Recipe(Layout.WORLD, Control.IN_BAND, plane, CamAsync())
