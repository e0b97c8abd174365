"""The assembler: builds any connector's parts and role endpoint from its recipe.

:func:`assemble` is the only way a composed connector is built (through
:func:`afd_core.assembly.assemble`). It reads the recipe's slots
(:mod:`afd_core.assembly`) and nothing else decides: the layout says which worlds to
open, the control slot whether to build the control channel, the data plane whether
the worlds get a data transport or an op provider's groups, and the pattern says who
exchanges with whom (its pairing rules) and builds the endpoints. Every part goes into
one :class:`~afd_core.runtime.parts.Parts`, whose take-down is the connector's shutdown
and also undoes a build that fails half-way.

:func:`endpoint_on_world` is the second half alone, on a world opened elsewhere (the
unit tests' loopback worlds).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from afd_core.assembly import (
    AttentionSide,
    Control,
    DataPeer,
    FFNSide,
    Layout,
    OpPlane,
    ReplayGuardSite,
    TransportPlane,
)
from afd_core.connector import ConnectorParts
from afd_core.dataplane.op_provider import GroupSite
from afd_core.dataplane.transport import TransferFailed
from afd_core.errors import AFDConfigError, AFDPeerError
from afd_core.kit.endpoint_context import EndpointContext
from afd_core.runtime.control.channel import ControlInbox, ControlSender
from afd_core.runtime.control.relay import LEADER_RANK, FollowingRelay, LeadingRelay
from afd_core.runtime.links import BlockLinks, LinkAcceptor, open_ffn_links, shared_links
from afd_core.runtime.parts import Part, Parts
from afd_core.runtime.world import (
    FFN_ON_LINK,
    World,
    join_session,
    open_ffn_group,
    open_link_world,
    open_world,
    peer_departed,
    peer_lost,
)

if TYPE_CHECKING:
    from afd_core.assembly import Recipe, RuntimeSpec, StepSource
    from afd_core.dataplane.replay_guard import ReplayGuard

#: Seconds the take-down waits for each thread of a part to end.
JOIN_TIMEOUT_S = 2.0


def assemble(spec: RuntimeSpec, recipe: Recipe) -> ConnectorParts:
    """See :func:`afd_core.assembly.assemble`."""
    check_recipe(spec, recipe)
    parts = Parts()
    try:
        if recipe.layout is Layout.WORLD:
            endpoint = _on_one_world(spec, recipe, parts)
        elif spec.role == "attention":
            endpoint = _attention_on_links(spec, recipe, parts)
        else:
            endpoint = _ffn_on_links(spec, recipe, parts)
    except BaseException:
        parts.take_down()
        raise
    return ConnectorParts(endpoint, (parts.take_down,))


def check_recipe(spec: RuntimeSpec, recipe: Recipe) -> None:
    """AFDConfigError when the recipe's slots do not fit together or ``spec`` cannot run
    its pattern."""
    pattern = recipe.pattern
    if not isinstance(recipe.data, pattern.data_plane):
        raise AFDConfigError(
            f"AFD {spec.name}: the {pattern.name} pattern runs on a "
            f"{pattern.data_plane.__name__}, the recipe gives a {type(recipe.data).__name__}"
        )
    if isinstance(recipe.data, OpPlane) and recipe.layout is not Layout.WORLD:
        raise AFDConfigError(
            f"AFD {spec.name}: an op plane's groups span one world of every rank; use Layout.WORLD"
        )
    if recipe.control not in pattern.controls:
        works = " or ".join(c.name for c in pattern.controls)
        raise AFDConfigError(
            f"AFD {spec.name}: the {pattern.name} pattern works with Control.{works}, the "
            f"recipe gives Control.{recipe.control.name}"
        )
    if recipe.replay_guard is not None and recipe.layout is not Layout.WORLD:
        raise AFDConfigError(
            f"AFD {spec.name}: a replay guard bounds the replays of one world's data plane; "
            "use Layout.WORLD (graph steps on links are not built)"
        )
    if recipe.control is Control.IN_BAND and recipe.layout is Layout.LINKS:
        raise AFDConfigError(
            f"AFD {spec.name}: links are opened per announcing attention rank; a recipe "
            "without announcements needs Layout.WORLD"
        )
    pattern.check(spec)


def _on_one_world(spec: RuntimeSpec, recipe: Recipe, parts: Parts) -> object:
    """Rendezvous, the world of every rank, its data plane, then the endpoint."""
    data_peers = _data_peers(spec, recipe)
    session, _ = join_session(spec, data_peers)
    parts.add(Part("rendezvous session", release=session.close))
    pattern, topology = recipe.pattern, spec.topology
    transport = recipe.data.open if isinstance(recipe.data, TransportPlane) else None
    liveness = pattern.liveness_peers(topology, spec.role, spec.role_rank)
    world = open_world(spec, session, transport, data_peers, liveness)
    parts.add(world.as_part("world"))
    return endpoint_on_world(spec, recipe, world, parts)


def _data_peers(spec: RuntimeSpec, recipe: Recipe) -> tuple[int, ...]:
    """The world ranks ``spec``'s rank exchanges data with, by the recipe's pattern."""
    pattern, topology = recipe.pattern, spec.topology
    if spec.role == "attention":
        return tuple(
            topology.world_rank("ffn", f) for f in pattern.ffn_peers(topology, spec.role_rank)
        )
    return tuple(
        topology.world_rank("attention", a)
        for a in pattern.attention_peers(topology, spec.role_rank)
    )


def endpoint_on_world(spec: RuntimeSpec, recipe: Recipe, world: World, parts: Parts) -> object:
    """``recipe``'s op groups (on an op plane), replay guard, control channel and role
    endpoint on the open ``world`` of every rank; their parts go into ``parts``."""
    pattern, topology = recipe.pattern, spec.topology
    op_groups = _open_op_groups(spec, recipe, world)
    replays = _replay_guard(spec, recipe, world, _data_peers(spec, recipe)[0], parts)
    context = _context(spec, world)
    if spec.role == "attention":
        announcer = None
        if recipe.control is Control.ANNOUNCED:
            targets = tuple(
                topology.world_rank("ffn", f) for f in pattern.announce_to(topology, spec.role_rank)
            )
            announcer = ControlSender(
                world.control, targets, world.timeout_s, spec.fuse, world.failures
            )
        peers = ()
        if world.data is not None:
            peers = tuple(
                DataPeer(f, world.data, topology.world_rank("ffn", f), world.failures)
                for f in pattern.ffn_peers(topology, spec.role_rank)
            )
        side = AttentionSide(spec, announcer, peers, op_groups, context, replays)
        return pattern.attention_endpoint(side)
    senders = {
        a: topology.world_rank("attention", a)
        for a in pattern.attention_peers(topology, spec.role_rank)
    }
    links = BlockLinks(spec.role_rank, shared_links(world, senders))
    steps = None
    if recipe.control is Control.ANNOUNCED:
        relay = world if pattern.relays_steps else None
        steps = _step_source(spec, recipe, links, relay, (world,), parts)
    return pattern.ffn_endpoint(FFNSide(spec, steps, links, op_groups, context, replays))


def _open_op_groups(spec: RuntimeSpec, recipe: Recipe, world: World) -> tuple[str, ...]:
    if not isinstance(recipe.data, OpPlane):
        return ()
    assert world.opener is not None, "an op plane needs a world opened in a session"
    provider = recipe.data.provider()
    topology = spec.topology
    site = GroupSite(spec.world_rank, topology.world_size, topology, spec.timeout_s, world.opener)
    names = provider.open(site, recipe.data.num_stages)
    world.provider = provider  # interrupted and released with the world from now on
    return names


def _replay_guard(
    spec: RuntimeSpec, recipe: Recipe, world: World, data_peer: int, parts: Parts
) -> ReplayGuard | None:
    """The recipe's replay guard; its overrun names ``data_peer`` (a world rank)."""
    if recipe.replay_guard is None:
        return None

    def fail(what: str) -> None:
        overran = TransferFailed(None, "timeout", f"{what} still running")
        spec.fuse.blow(world.failures.error(overran, what, data_peer))
        world.interrupt_data()

    guard = recipe.replay_guard(ReplayGuardSite(spec, fail))
    parts.add(Part("replay guard", interrupt=guard.stop))
    return guard  # type: ignore[return-value]


def _context(spec: RuntimeSpec, world: World) -> EndpointContext | None:
    if world.data is None:
        return None
    return EndpointContext(
        spec.wire, spec.role_rank, world.data, spec.fuse, world.failures, world.timeout_s
    )


def _step_source(
    spec: RuntimeSpec,
    recipe: Recipe,
    links: BlockLinks,
    relay: World | None,
    boundary_worlds: Iterable[World],
    parts: Parts,
) -> StepSource:
    """The FFN side of the control channel: the inbox of the attention ranks that
    announce to this FFN rank and, where the pattern relays steps, the step relay over
    ``relay``'s control transport (on which the FFN ranks are ranks ``0..F-1``). A
    departure wakes the waits at a step boundary of ``boundary_worlds``."""
    rank = spec.role_rank
    source: StepSource
    if relay is not None and rank != LEADER_RANK:
        following = FollowingRelay(
            links, relay.control, spec.topology.num_attention_ranks, spec.timeout_s,
            spec.fuse, relay.failures, f"afd-relay-f{rank}",
        )  # fmt: skip
        following.start()
        parts.add(Part("step relay", join=lambda: following.stop(JOIN_TIMEOUT_S)))
        wake, source = following.wake, following
    else:
        inbox = ControlInbox(links, spec.fuse, f"afd-control-f{rank}")
        inbox.start()
        parts.add(Part("control inbox", join=lambda: inbox.stop(JOIN_TIMEOUT_S)))
        wake, source = inbox.wake, inbox
        if relay is not None:
            source = LeadingRelay(
                inbox, links, relay.control, tuple(range(1, spec.topology.num_ffn_ranks)),
                spec.topology.num_attention_ranks, spec.timeout_s, relay.failures,
            )  # fmt: skip
    for world in boundary_worlds:
        world.boundary_waiters.append(wake)
    return source


def _attention_on_links(spec: RuntimeSpec, recipe: Recipe, parts: Parts) -> object:
    """Attention side on links: the rendezvous (a server may take the seat of an
    attention rank that left, :mod:`afd_core.runtime.seats`), then a link with every FFN
    rank of the pattern's pairing, in FFN rank order."""
    assert isinstance(recipe.data, TransportPlane)
    session, generation = join_session(spec, _data_peers(spec, recipe), seated=True)
    parts.add(Part("rendezvous session", release=session.close))
    pattern, topology = recipe.pattern, spec.topology
    worlds: dict[int, World] = {}

    def lost(world: World, error: AFDPeerError) -> None:
        # The rank fails: the failure first, so that every wait the interrupts end
        # reports it (not "closed the connection"), then every wait on every link ends.
        spec.fuse.blow(error)
        for each in worlds.values():
            each.interrupt()
        peer_lost(spec, world, error)

    def departed(world: World, peer: int, error: AFDPeerError) -> None:
        peer_departed(spec, world, peer, error)

    for f in pattern.ffn_peers(topology, spec.role_rank):
        world = open_link_world(
            spec, recipe.data.open, session, spec.role_rank, f, generation,
            on_lost=lost, on_departed=departed,
        )  # fmt: skip
        worlds[f] = world
        parts.add(world.as_part(f"link to FFN rank {f}"))
    (announce_to,) = pattern.announce_to(topology, spec.role_rank)
    leader = worlds[announce_to]
    announcer = ControlSender(
        leader.control, (FFN_ON_LINK,), spec.timeout_s, spec.fuse, leader.failures
    )
    first = next(iter(worlds.values()))
    peers = tuple(DataPeer(f, w.data, FFN_ON_LINK, w.failures) for f, w in worlds.items())  # type: ignore[arg-type]
    side = AttentionSide(spec, announcer, peers, (), _context(spec, first))
    return pattern.attention_endpoint(side)


def _ffn_on_links(spec: RuntimeSpec, recipe: Recipe, parts: Parts) -> object:
    """FFN side on links: the rendezvous, the FFN ranks' own world where the pattern
    relays steps, a link with every attention rank of the pattern's pairing (in rank
    order: no two ranks wait for each other in a cycle), the control channel and, when
    attention ranks may be replaced (``ffn_idle_limit_s`` > 0), the link acceptor. The
    FFN rank that receives an attention rank's announcements keeps its seat records."""
    assert isinstance(recipe.data, TransportPlane)
    session, _ = join_session(spec, _data_peers(spec, recipe))
    parts.add(Part("rendezvous session", release=session.close))
    pattern, rank = recipe.pattern, spec.role_rank
    relay_world = None
    if pattern.relays_steps:
        relay_world = open_ffn_group(spec, session)
        parts.add(relay_world.as_part("FFN group"))
    ranks = pattern.attention_peers(spec.topology, rank)
    replaceable = spec.config.ffn_idle_limit_s > 0
    owns_seats = bool(pattern.announcers_of(spec.topology, rank))
    links, open_one = open_ffn_links(
        spec, recipe.data.open, session, ranks, replaceable=replaceable, owns_seats=owns_seats
    )
    parts.add(Part("links", interrupt=links.interrupt, release=links.close))
    link_worlds = [link.world for link in links.current().values() if link.world is not None]
    boundary_worlds = link_worlds if relay_world is None else [relay_world, *link_worlds]
    steps = _step_source(spec, recipe, links, relay_world, boundary_worlds, parts)
    if replaceable:
        acceptor = LinkAcceptor(links, session, ranks, open_one, spec.timeout_s)
        acceptor.start()
        parts.add(Part("link acceptor", join=lambda: acceptor.stop(JOIN_TIMEOUT_S)))
    context = _context(spec, link_worlds[0])
    return pattern.ffn_endpoint(FFNSide(spec, steps, links, (), context))
