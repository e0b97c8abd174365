"""``P2pNcclAFDConnector``: afd-core's P2P endpoints with the data plane on NCCL (CUDA tensors).

A recipe (:mod:`afd_core.assembly`): one world of every rank, steps announced on afd-core's
gloo control channel, this package's
:class:`~afd_connectors_gpu.nccl_transport.NcclTransport` as the data plane, the P2P block
pattern, and :class:`~afd_connectors_gpu.replay_watch.CudaReplayGuard` for CUDA graph
steps.

Message buffers are tensors on the current CUDA device at ``initialize()`` (the worker's
device inside vLLM; ``connector_extra_config`` is shared by both roles, so it cannot name
a device). Eager steps send a header message per layer from a header block copied to the
device once per step and check the received headers on the device once per step (one
host synchronisation per step, none per message). CUDA graph steps send bare tensors and
are captured whole; the replay guard bounds the replays the host does not wait for.
Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from afd_connectors_gpu.nccl_transport import NcclTransport
from afd_connectors_gpu.replay_watch import CudaReplayGuard
from afd_core.assembly import (
    P2P_BLOCK,
    Control,
    Layout,
    P2pBlock,
    Recipe,
    ReplayGuardSite,
    TransportPlane,
    TransportSite,
)
from afd_core.capabilities import Capabilities
from afd_core.config.coercion import reject_unknown_fields, to_bool
from afd_core.connector import Connector
from afd_core.dataplane.transport import Transport


@dataclass(frozen=True)
class NcclExtraConfig:
    """``connector_extra_config`` of :class:`P2pNcclAFDConnector`.

    ``high_priority_stream``: run NCCL's ops on a high-priority CUDA stream.
    """

    high_priority_stream: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> NcclExtraConfig:
        """Parse ``raw`` strictly; AFDConfigError naming any unknown or invalid field."""
        reject_unknown_fields(
            raw, ("high_priority_stream",), "P2pNcclAFDConnector",
            " (each rank uses its current CUDA device)",
        )  # fmt: skip
        return cls(
            to_bool(
                "connector_extra_config.high_priority_stream",
                raw.get("high_priority_stream", False),
            )
        )


class P2pNcclAFDConnector(Connector):
    """AFD connector: gloo control channel, NCCL data plane, P2P endpoints.

    World order and rendezvous are afd-core's (FFN rank 0 hosts the store at
    ``config.host:config.port``). Each rank uses one CUDA device; two ranks cannot share
    one (NCCL refuses "Duplicate GPU").
    """

    name = "P2pNcclAFDConnector"
    pattern_type = P2pBlock
    capabilities = Capabilities(cuda_graphs=True)

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> NcclExtraConfig:
        """Accept ``high_priority_stream`` (see :class:`NcclExtraConfig`)."""
        return NcclExtraConfig.parse(raw)

    def recipe(self) -> Recipe:
        """One world, announced steps, the NCCL data plane, the P2P block pattern, and a
        CUDA replay guard for graph steps."""
        extra: NcclExtraConfig = self.extra

        def data(site: TransportSite) -> Transport:
            return NcclTransport.open(
                site.opener, site.world_rank, site.world_size, site.peers, site.timeout_s,
                high_priority_stream=extra.high_priority_stream,
            )  # fmt: skip

        def replays(site: ReplayGuardSite) -> CudaReplayGuard:
            name = f"afd-replay-watch-{site.spec.role}{site.spec.role_rank}"
            return CudaReplayGuard(site.spec.timeout_s, site.fail, name)

        return Recipe(Layout.WORLD, Control.ANNOUNCED, TransportPlane(data), P2P_BLOCK, replays)
