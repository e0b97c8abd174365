"""``P2pNcclAFDConnector``: afd-core's P2P endpoints with the data plane on NCCL (CUDA tensors).

Composed of public parts (docs/design.md): afd-core's rendezvous, gloo control channel and
P2P endpoints (:func:`afd_core.runtime.p2p.open_p2p`), this package's
:class:`~afd_connectors_gpu.nccl_transport.NcclTransport` as the data transport and
:class:`~afd_connectors_gpu.replay_watch.CudaReplayGuard` for CUDA graph steps.

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
from afd_core.coercion import to_bool
from afd_core.connector import Connector, ConnectorParts
from afd_core.errors import AFDConfigError
from afd_core.runtime.p2p import open_p2p
from afd_core.runtime.rendezvous import Session
from afd_core.transport import TransferFailed, Transport
from afd_core.runtime.gloo import GlooTransport
from afd_core.runtime.world import World


@dataclass(frozen=True)
class NcclExtraConfig:
    """``connector_extra_config`` of :class:`P2pNcclAFDConnector`.

    ``high_priority_stream``: run NCCL's ops on a high-priority CUDA stream.
    """

    high_priority_stream: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> NcclExtraConfig:
        """Parse ``raw`` strictly; AFDConfigError naming any unknown or invalid field."""
        unknown = sorted(set(raw) - {"high_priority_stream"})
        if unknown:
            raise AFDConfigError(
                f"AFD config: connector_extra_config has unknown fields {unknown} for "
                "P2pNcclAFDConnector; it accepts only high_priority_stream (each rank uses "
                "its current CUDA device)"
            )
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

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> NcclExtraConfig:
        """Accept ``high_priority_stream`` (see :class:`NcclExtraConfig`)."""
        return NcclExtraConfig.parse(raw)

    def connect(self) -> ConnectorParts:
        """Rendezvous, gloo control group, NCCL data group, P2P endpoint, replay guard."""
        guards: list[CudaReplayGuard] = []

        def data(
            session: Session, control: GlooTransport, rank: int, size: int, timeout_s: float
        ) -> Transport:
            peers = self.topology.peers_of(self.config.role, self.role_rank)
            return NcclTransport.open(
                session, rank, size, peers, timeout_s,
                high_priority_stream=self.extra.high_priority_stream,
            )  # fmt: skip

        def replays(connector: Connector, world: World) -> CudaReplayGuard:
            def overrun(what: str) -> None:
                peer = self.topology.peers_of(self.config.role, self.role_rank)[0]
                overran = TransferFailed(None, "timeout", f"{what} still running")
                error = world.failures.error(overran, what, peer)
                connector.fuse.blow(error)
                world.data.interrupt()

            guard = CudaReplayGuard(
                world.timeout_s, overrun, f"afd-replay-watch-{self.config.role}{self.role_rank}"
            )
            guards.append(guard)
            return guard

        parts = open_p2p(self, data, replays)
        return ConnectorParts(parts.endpoint, (*(g.stop for g in guards), *parts.shutdown))
