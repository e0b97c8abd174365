"""The P2P block exchange: each FFN rank serves a contiguous block of attention ranks.

* :mod:`~afd_core.runtime.p2p.attention`: :class:`P2pAttentionEndpoint`;
* :mod:`~afd_core.runtime.p2p.ffn`: :class:`P2pFFNEndpoint`;
* :mod:`~afd_core.runtime.p2p.headers`: the per-step header rows both sides write and check;
* :mod:`~afd_core.runtime.p2p.frames`: messages up to 1 MiB on host transports as one frame
  each, header and tensors together;
* the FFN rank's links to its attention ranks, and servers that replace an attention
  rank, live in :mod:`afd_core.runtime.links` (the expert-routed exchange uses them too).

Two ways to lay out a P2P connector's transports:

* :func:`open_p2p`: one world of every rank (one control group, one data transport);
  ``P2pNcclAFDConnector`` (afd-connectors-gpu) uses it;
* :func:`open_p2p_links`: a world of its own per attention rank and its FFN rank
  (:func:`afd_core.runtime.world.open_link`), so that an attention server can leave and be
  replaced while its FFN rank keeps serving the others; ``P2pGlooAFDConnector`` uses it.

Either way the same endpoints and control channel run on top.
"""

from __future__ import annotations

from collections.abc import Callable

from afd_core.connector import Connector, ConnectorParts
from afd_core.runtime.control.channel import ControlInbox, ControlSender
from afd_core.runtime.endpoint_context import EndpointContext
from afd_core.replay_guard import ReplayGuard
from afd_core.runtime.links import BlockLinks, LinkAcceptor, open_ffn_links, shared_links
from afd_core.runtime.p2p.attention import P2pAttentionEndpoint, P2pPeer
from afd_core.runtime.p2p.ffn import P2pFFNEndpoint
from afd_core.runtime.rendezvous import Session
from afd_core.runtime.world import (
    FFN_ON_LINK,
    DataTransportFactory,
    World,
    join_session,
    open_link,
    open_world,
    peer_departed,
    peer_lost,
)

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
    """``connector``'s P2P parts on an open ``world`` of every rank: control channel and
    endpoint.

    The FFN side's control receiver threads start here. The parts' shutdown interrupts
    the world, joins those threads, then releases the world.
    """
    config, topology, fuse = connector.config, connector.topology, connector.fuse
    guard = None if replays is None else replays(connector, world)
    context = EndpointContext.of(connector, world)
    if config.role == "attention":
        ffn_rank = topology.ffn_rank_of(connector.role_rank)
        peer = P2pPeer(ffn_rank, topology.world_rank("ffn", ffn_rank))
        return _attention_parts(connector, world, peer, guard)
    senders = {
        a: topology.world_rank("attention", a) for a in topology.block_of(connector.role_rank)
    }
    links = BlockLinks(connector.role_rank, shared_links(world, senders))
    inbox = ControlInbox(links, fuse, f"afd-control-f{connector.role_rank}")
    inbox.start()
    world.boundary_waiters.append(inbox.wake)
    endpoint = P2pFFNEndpoint(context, links=links, inbox=inbox, replays=guard)
    return ConnectorParts(
        endpoint, (world.interrupt, lambda: inbox.stop(JOIN_TIMEOUT_S), world.release)
    )


def _attention_parts(
    connector: Connector, world: World, peer: P2pPeer, guard: ReplayGuard | None
) -> ConnectorParts:
    sender = ControlSender(
        world.control, (peer.transport_rank,), world.timeout_s, connector.fuse, world.failures
    )
    context = EndpointContext.of(connector, world)
    endpoint = P2pAttentionEndpoint(context, peer=peer, control=sender, replays=guard)
    return ConnectorParts(endpoint, (world.interrupt, world.release))


def open_p2p_links(connector: Connector, data: DataTransportFactory) -> ConnectorParts:
    """Rendezvous and build ``connector``'s P2P parts on links of their own.

    Attention side: the rendezvous (a server may take the seat of an attention rank that
    left, :mod:`afd_core.runtime.seats`), then its link with its FFN rank. FFN side: the
    rendezvous, a link with every attention rank of its block, the control inbox and,
    when attention ranks may be replaced (``ffn_idle_limit_s`` > 0), the
    :class:`~afd_core.runtime.links.LinkAcceptor`. Bounded by the AFD timeout.
    """
    config, topology = connector.config, connector.topology
    # Seats are marked only by an FFN rank that lets links go; an attention rank always
    # looks for one, whatever its own ffn_idle_limit_s (a setting of the FFN role).
    session, generation = join_session(connector, seated=config.role == "attention")
    if config.role == "attention":
        ffn_rank = topology.ffn_rank_of(connector.role_rank)
        world = open_link(
            connector, data, session, connector.role_rank, ffn_rank, generation,
            owns_session=True,
            on_lost=lambda w, error: peer_lost(connector, w, error),
            on_departed=lambda w, peer, error: peer_departed(connector, w, peer, error),
        )  # fmt: skip
        return _attention_parts(connector, world, P2pPeer(ffn_rank, FFN_ON_LINK), None)
    try:
        return _ffn_link_parts(connector, data, session, config.ffn_idle_limit_s > 0)
    except BaseException:
        session.close()
        raise


def _ffn_link_parts(
    connector: Connector, data: DataTransportFactory, session: Session, replaceable: bool
) -> ConnectorParts:
    config, fuse = connector.config, connector.fuse
    ffn_rank = connector.role_rank
    block = tuple(connector.topology.block_of(ffn_rank))
    links, open_one = open_ffn_links(
        connector, data, session, block, replaceable=replaceable, owns_seats=True
    )
    timeout_s = float(config.afd_process_group_timeout_s)
    first = links.get(block[0])  # every link's transports are alike: the context's
    context = EndpointContext(connector.wire, ffn_rank, first.data, fuse, first.failures, timeout_s)
    inbox = ControlInbox(links, fuse, f"afd-control-f{ffn_rank}")
    inbox.start()
    # A departure waits for a step boundary only when it fails the FFN rank (links not
    # replaceable), and then no acceptor adds links: the links of the start suffice.
    for link in links.current().values():
        assert link.world is not None
        link.world.boundary_waiters.append(inbox.wake)
    endpoint = P2pFFNEndpoint(context, links=links, inbox=inbox)
    shutdown: list[Callable[[], None]] = []
    if replaceable:
        acceptor = LinkAcceptor(links, session, block, open_one, timeout_s)
        acceptor.start()
        shutdown.append(lambda: acceptor.stop(JOIN_TIMEOUT_S))
    shutdown += [links.interrupt, lambda: inbox.stop(JOIN_TIMEOUT_S), links.close, session.close]
    return ConnectorParts(endpoint, tuple(shutdown))
