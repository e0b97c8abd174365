"""The P2P block exchange: each FFN rank serves a contiguous block of attention ranks.

* :mod:`~afd_core.p2p.attention`: :class:`P2pAttentionEndpoint`;
* :mod:`~afd_core.p2p.ffn`: :class:`P2pFFNEndpoint`;
* :mod:`~afd_core.p2p.headers`: the per-step header rows both sides write and check.

:func:`open_p2p` assembles a P2P connector's parts from an open world: the control
channel (sender or inbox) on the world's control transport and the endpoint on its data
transport. ``P2pGlooAFDConnector`` (afd-core) and ``P2pNcclAFDConnector``
(afd-connectors-gpu) differ only in the data transport and the replay guard they pass.
"""

from __future__ import annotations

from collections.abc import Callable

from afd_core.connector import Connector, ConnectorParts
from afd_core.control.channel import ControlInbox, ControlSender
from afd_core.endpoint_context import EndpointContext
from afd_core.graphs import ReplayGuard
from afd_core.p2p.attention import P2pAttentionEndpoint, P2pPeer
from afd_core.p2p.ffn import P2pFFNEndpoint
from afd_core.world import DataTransportFactory, World, open_world

#: Builds a connector's replay guard once its world is open (connectors with graph steps).
ReplayGuardFactory = Callable[[Connector, World], ReplayGuard]

#: Seconds ``close()`` waits for each control receiver thread to end.
JOIN_TIMEOUT_S = 2.0


def open_p2p(
    connector: Connector,
    data: DataTransportFactory,
    replays: ReplayGuardFactory | None = None,
) -> ConnectorParts:
    """Rendezvous and build ``connector``'s P2P parts (see the module docstring)."""
    world = open_world(connector, data)
    try:
        return assemble_p2p(connector, world, replays)
    except BaseException:
        world.interrupt()
        world.release()
        raise


def assemble_p2p(
    connector: Connector, world: World, replays: ReplayGuardFactory | None = None
) -> ConnectorParts:
    """``connector``'s P2P parts on an open ``world``: control channel and endpoint.

    The FFN side's control receiver threads start here. The parts' shutdown interrupts
    the world, joins those threads, then releases the world.
    """
    config, topology, fuse = connector.config, connector.topology, connector.fuse
    guard = None if replays is None else replays(connector, world)
    context = EndpointContext.of(connector, world)
    if config.role == "attention":
        ffn_rank = topology.ffn_rank_of(connector.role_rank)
        peer = P2pPeer(ffn_rank, topology.world_rank("ffn", ffn_rank))
        sender = ControlSender(
            world.control, (peer.world_rank,), world.timeout_s, fuse, world.failures
        )
        endpoint = P2pAttentionEndpoint(context, peer=peer, control=sender, replays=guard)
        return ConnectorParts(endpoint, (world.interrupt, world.release))
    senders = {
        a: topology.world_rank("attention", a) for a in topology.block_of(connector.role_rank)
    }
    inbox = ControlInbox(
        world.control, senders, fuse, world.failures, f"afd-control-f{connector.role_rank}"
    )
    inbox.start()
    world.boundary_waiters.append(inbox.wake)
    endpoint_ffn = P2pFFNEndpoint(context, senders=senders, inbox=inbox, replays=guard)
    return ConnectorParts(
        endpoint_ffn, (world.interrupt, lambda: inbox.stop(JOIN_TIMEOUT_S), world.release)
    )
