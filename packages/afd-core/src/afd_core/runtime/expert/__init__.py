"""The expert-routed M:N exchange: routed experts split over the FFN ranks in blocks.

* :mod:`~afd_core.placement`: which FFN rank holds which experts (pure);
* :mod:`~afd_core.runtime.expert.routing`: rows per FFN rank, local expert ids, the combine;
* :mod:`~afd_core.runtime.expert.messages`: the packed body of an attention-to-FFN message;
* :mod:`~afd_core.runtime.expert.attention` and :mod:`~afd_core.runtime.expert.ffn`: the endpoints.

:func:`open_expert` (one world of every rank: the NCCL transport) and
:func:`open_expert_links` (a link of its own per (attention rank, FFN rank) pair plus a
group of the FFN ranks: gloo, so that an attention server can leave and be replaced
while every FFN rank keeps serving the others) assemble a connector's parts: the control
channel (attention ranks announce steps to FFN rank 0, whose
:class:`~afd_core.runtime.control.relay.LeadingRelay` forwards them to the other FFN ranks) and
the endpoints, over any data transport. This is the seam for other dispatch/combine
backends: a DeepEP or NVSHMEM backend would provide its own endpoint pair with the same
contract (afd-connectors-gpu's ``DeepEPM2NAFDConnector`` composes these point-to-point
endpoints today).
"""

from __future__ import annotations

from collections.abc import Callable

from afd_core.connector import Connector, ConnectorParts
from afd_core.runtime.control.channel import ControlInbox, ControlSender
from afd_core.runtime.control.relay import LEADER_RANK, FollowingRelay, LeadingRelay
from afd_core.runtime.endpoint_context import EndpointContext
from afd_core.errors import AFDPeerError
from afd_core.runtime.expert.attention import ExpertAttentionEndpoint, FFNPeer
from afd_core.runtime.expert.ffn import ExpertFFNEndpoint
from afd_core.runtime.expert.messages import check_packable
from afd_core.placement import ExpertPlacement
from afd_core.runtime.links import BlockLinks, LinkAcceptor, open_ffn_links, shared_links
from afd_core.runtime.rendezvous import Session
from afd_core.runtime.world import (
    FFN_ON_LINK,
    DataTransportFactory,
    World,
    join_session,
    open_ffn_group,
    open_link,
    open_world,
    peer_departed,
    peer_lost,
)

#: Seconds ``close()`` waits for each control receiver thread to end.
JOIN_TIMEOUT_S = 2.0


def open_expert(connector: Connector, data: DataTransportFactory) -> ConnectorParts:
    """Rendezvous and build ``connector``'s expert-routed parts on one world of every rank."""
    check_packable(connector.wire)
    world = open_world(connector, data)
    try:
        return assemble_expert(connector, world)
    except BaseException:
        world.interrupt()
        world.release()
        raise


def assemble_expert(connector: Connector, world: World) -> ConnectorParts:
    """``connector``'s expert-routed parts on an open ``world`` of every rank.

    The FFN side's relay (and, on FFN rank 0, control receiver) threads start here. The
    parts' shutdown interrupts the world, joins those threads, then releases the world.
    """
    topology, fuse = connector.topology, connector.fuse
    context = EndpointContext.of(connector, world)
    if connector.config.role == "attention":
        peers = tuple(
            FFNPeer(world.data, topology.world_rank("ffn", f), world.failures)
            for f in range(topology.num_ffn_ranks)
        )
        sender = ControlSender(
            world.control, (topology.world_rank("ffn", LEADER_RANK),), world.timeout_s, fuse,
            world.failures,
        )  # fmt: skip
        return ConnectorParts(
            _attention_endpoint(connector, context, peers, sender),
            (world.interrupt, world.release),
        )
    senders = {a: topology.world_rank("attention", a) for a in range(topology.num_attention_ranks)}
    links = BlockLinks(connector.role_rank, shared_links(world, senders))
    followers = tuple(topology.world_rank("ffn", f) for f in range(1, topology.num_ffn_ranks))
    endpoint, stop = _ffn_endpoint(connector, context, links, world, followers)
    return ConnectorParts(endpoint, (world.interrupt, stop, world.release))


def open_expert_links(connector: Connector, data: DataTransportFactory) -> ConnectorParts:
    """Rendezvous and build ``connector``'s expert-routed parts on links of their own.

    Attention side: the rendezvous (a server may take the seat of an attention rank that
    left, :mod:`afd_core.runtime.seats`), then its link with every FFN rank, in FFN rank order.
    FFN side: the rendezvous, the group of the FFN ranks, a link with every attention
    rank (in attention rank order: no two ranks wait for each other in a cycle), the
    relay and, when attention ranks may be replaced (``ffn_idle_limit_s`` > 0), the
    :class:`~afd_core.runtime.links.LinkAcceptor`. FFN rank 0 keeps the seat records. Bounded
    by the AFD timeout.
    """
    check_packable(connector.wire)
    session, generation = join_session(connector, seated=connector.config.role == "attention")
    try:
        if connector.config.role == "attention":
            return _attention_link_parts(connector, data, session, generation)
        return _ffn_link_parts(connector, data, session)
    except BaseException:
        session.close()
        raise


def _attention_link_parts(
    connector: Connector, data: DataTransportFactory, session: Session, generation: int
) -> ConnectorParts:
    worlds: list[World] = []

    def interrupt() -> None:
        for world in worlds:
            world.interrupt()

    def lost(world: World, error: AFDPeerError) -> None:
        interrupt()  # every wait on every link ends: the attention rank fails
        peer_lost(connector, world, error)

    def departed(world: World, peer: int, error: AFDPeerError) -> None:
        peer_departed(connector, world, peer, error)

    def release() -> None:
        for world in worlds:
            world.release()

    rank = connector.role_rank
    try:
        for f in range(connector.topology.num_ffn_ranks):
            world = open_link(
                connector, data, session, rank, f, generation, owns_session=False,
                on_lost=lost, on_departed=departed,
            )  # fmt: skip
            worlds.append(world)
    except BaseException:
        interrupt()
        release()
        raise
    first = worlds[LEADER_RANK]
    timeout_s = first.timeout_s
    peers = tuple(FFNPeer(w.data, FFN_ON_LINK, w.failures) for w in worlds)
    sender = ControlSender(first.control, (FFN_ON_LINK,), timeout_s, connector.fuse, first.failures)
    context = EndpointContext(
        connector.wire, connector.role_rank, first.data, connector.fuse, first.failures, timeout_s
    )
    endpoint = _attention_endpoint(connector, context, peers, sender)
    return ConnectorParts(endpoint, (interrupt, release, session.close))


def _ffn_link_parts(
    connector: Connector, data: DataTransportFactory, session: Session
) -> ConnectorParts:
    config, topology = connector.config, connector.topology
    group = open_ffn_group(connector, session)
    ranks = tuple(range(topology.num_attention_ranks))
    replaceable = config.ffn_idle_limit_s > 0
    try:
        links, open_one = open_ffn_links(
            connector, data, session, ranks, replaceable=replaceable,
            owns_seats=connector.role_rank == LEADER_RANK,
        )  # fmt: skip
    except BaseException:
        group.interrupt()
        group.release()
        raise
    first = links.get(ranks[0])
    timeout_s = group.timeout_s
    context = EndpointContext(
        connector.wire, connector.role_rank, first.data, connector.fuse, first.failures, timeout_s
    )
    followers = tuple(range(1, topology.num_ffn_ranks))
    endpoint, stop = _ffn_endpoint(connector, context, links, group, followers)
    shutdown: list[Callable[[], None]] = []
    if replaceable:
        acceptor = LinkAcceptor(links, session, ranks, open_one, timeout_s)
        acceptor.start()
        shutdown.append(lambda: acceptor.stop(JOIN_TIMEOUT_S))
    shutdown += [links.interrupt, group.interrupt, stop, links.close, group.release, session.close]
    return ConnectorParts(endpoint, tuple(shutdown))


def _attention_endpoint(
    connector: Connector,
    context: EndpointContext,
    peers: tuple[FFNPeer, ...],
    sender: ControlSender,
) -> ExpertAttentionEndpoint:
    placement = ExpertPlacement(connector.wire.num_experts, connector.topology.num_ffn_ranks)
    return ExpertAttentionEndpoint(context, placement=placement, ffn_peers=peers, control=sender)


def _ffn_endpoint(
    connector: Connector,
    context: EndpointContext,
    links: BlockLinks,
    relay_world: World,
    followers: tuple[int, ...],
) -> tuple[ExpertFFNEndpoint, Callable[[], None]]:
    """The FFN endpoint and how to stop its threads. ``relay_world``'s control transport
    carries the step frames (``followers``: the other FFN ranks' numbers on it)."""
    topology, fuse = connector.topology, connector.fuse
    rank = connector.role_rank
    num_attention = topology.num_attention_ranks
    relay: LeadingRelay | FollowingRelay
    if rank == LEADER_RANK:
        inbox = ControlInbox(links, fuse, f"afd-control-f{rank}")
        inbox.start()
        wake = inbox.wake
        relay = LeadingRelay(
            inbox, links, relay_world.control, followers, num_attention, context.timeout_s,
            relay_world.failures,
        )  # fmt: skip

        def stop() -> None:
            inbox.stop(JOIN_TIMEOUT_S)
    else:
        following = FollowingRelay(
            links, relay_world.control, num_attention, context.timeout_s, fuse,
            relay_world.failures, f"afd-relay-f{rank}",
        )  # fmt: skip
        following.start()
        wake, relay = following.wake, following

        def stop() -> None:
            following.stop(JOIN_TIMEOUT_S)

    # A departure wakes the waits at a step boundary (the relay then checks the fuse).
    relay_world.boundary_waiters.append(wake)
    for link in links.current().values():
        if link.world is not None:
            link.world.boundary_waiters.append(wake)
    placement = ExpertPlacement(connector.wire.num_experts, topology.num_ffn_ranks)
    endpoint = ExpertFFNEndpoint(context, block=placement.block(rank), links=links, relay=relay)
    return endpoint, stop
