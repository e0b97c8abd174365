"""Opening an AFD world: the rendezvous, then the control channel's and the data plane's transports.

Every composed connector starts the same way (:func:`open_world`: one world of every
rank; :func:`open_link`: a world of two ranks per (attention rank, FFN rank) pair, after
:func:`join_session`, for connectors whose attention servers can be replaced, plus
:func:`open_ffn_group` where the FFN ranks talk among themselves):

1. the rendezvous of :mod:`afd_core.runtime.rendezvous` (FFN rank 0 hosts the store; every rank
   publishes and compares its hello record, so mismatched peers fail here, naming both
   views);
2. the control transport: a :class:`~afd_core.runtime.gloo.GlooTransport` on the
   session's ``control/`` prefix (control frames live in host memory on every platform);
3. the data transport, from the connector's :data:`DataTransportFactory` (the control
   group under a second tag for the gloo connectors, NCCL for afd-connectors-gpu);
4. the :class:`~afd_core.runtime.liveness.PeerWatch`: a heartbeat link to every peer. A peer
   that crashed, was killed or went silent fails the connector (its fuse) at once and
   interrupts both transports; a peer that closed its connector (said goodbye) fails it
   at the next step boundary (``Fuse.depart``), so steps in flight with other peers
   finish, and wakes the waits at a step boundary (:attr:`World.boundary_waiters`).
   (On a link the caller decides instead: an FFN rank may let the link go, see
   :mod:`afd_core.runtime.links`.) Either way the connector's ``on_peer_lost`` runs next:
   the role worker ends itself (a wait with no deadline, such as an expert-routed
   follower FFN rank waiting for its leader's next step, ends when the worker closes the
   connector).

:class:`World` holds them and knows the order in which they go down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from afd_core.errors import AFDPeerError, AFDShutdown
from afd_core.failures import PeerFailures
from afd_core.runtime.liveness import PeerWatch
from afd_core.runtime.rendezvous import Hello, Session, exchange_hello, open_session
from afd_core.runtime.store_gate import rendezvous_secret
from afd_core.transport import Transport
from afd_core.runtime.gloo import TAG_DATA, GlooTransport

if TYPE_CHECKING:
    from afd_core.connector import Connector

#: Builds the data transport: ``(session, control, world_rank, world_size, timeout_s)``;
#: may raise AFDPeerError (a rank did not come) or AFDConfigError (the platform cannot run
#: it). ``control`` is the open control transport (a data plane on gloo shares its group).
DataTransportFactory = Callable[[Session, GlooTransport, int, int, float], Transport]


def gloo_data_transport(
    session: Session, control: GlooTransport, world_rank: int, world_size: int, timeout_s: float
) -> Transport:
    """The data plane over gloo: the control transport's group, under the data tag."""
    return control.share(TAG_DATA)


def open_gloo(
    session: Session, name: str, world_rank: int, world_size: int, timeout_s: float
) -> GlooTransport:
    """A gloo transport on the session's ``name/`` prefix; AFDPeerError when a rank is gone."""
    try:
        return GlooTransport.open(session.prefix_store(name), world_rank, world_size, timeout_s)
    except RuntimeError as exc:
        raise AFDPeerError(
            f"AFD: creating the gloo group {name!r} of {world_size} ranks at {session.address} "
            f"failed ({exc}); a rank stopped right after the rendezvous — see the logs of the "
            "other ranks"
        ) from exc


@dataclass
class World:
    """An open AFD world as one rank sees it."""

    session: Session | None
    control: Transport
    data: Transport
    failures: PeerFailures
    timeout_s: float
    watch: PeerWatch | None = None
    #: Wake a wait at a step boundary (it then checks ``Fuse.check_departure``).
    boundary_waiters: list[Callable[[], None]] = field(default_factory=list)

    def interrupt(self) -> None:
        """Tell the peers this rank leaves, wake every wait on either transport (first
        step of shutting down)."""
        if self.watch is not None:
            self.watch.close()
        self.data.interrupt()
        self.control.interrupt()

    def release(self) -> None:
        """Close both transports and drop the rendezvous store (last step)."""
        self.data.close()
        self.control.close()
        if self.session is not None:
            self.session.close()
        self.session = None


def join_session(connector: Connector, seated: bool = False) -> tuple[Session, int]:
    """Open (FFN rank 0: host) the rendezvous session and exchange hello records.

    Returns the session and the generation of the seat this rank took (``seated``: see
    :func:`~afd_core.runtime.rendezvous.exchange_hello`; 0 otherwise). Bounded by
    ``afd_process_group_timeout_s``; ``connector.close()`` meanwhile makes it raise
    AFDShutdown. Raises what the rendezvous raises; the session is closed again then.
    """
    config, topology = connector.config, connector.topology
    timeout_s = float(config.afd_process_group_timeout_s)

    def should_stop() -> bool:
        return connector.is_closed

    session = open_session(
        config.host, config.port, connector.world_rank == 0, timeout_s, should_stop,
        rendezvous_secret(),
    )  # fmt: skip
    try:
        generation = exchange_hello(
            session, Hello.of(config, connector.role_rank, connector.wire), topology,
            timeout_s, should_stop, seated,
        )  # fmt: skip
    except BaseException:
        session.close()
        raise
    return session, generation


def open_world(connector: Connector, data: DataTransportFactory) -> World:
    """Rendezvous as ``connector``'s rank and open its control and data transports.

    Bounded by ``afd_process_group_timeout_s``; ``connector.close()`` meanwhile makes it
    raise AFDShutdown. Raises what the rendezvous raises (AFDProtocolError for
    mismatched peers, AFDPeerError for a rank that does not come, AFDConfigError for a
    port in use). Whatever it opened is closed again when it raises.
    """
    config, topology = connector.config, connector.topology
    timeout_s = float(config.afd_process_group_timeout_s)
    rank, size = connector.world_rank, topology.world_size
    session, _ = join_session(connector)
    world = _open_transports(connector, data, session, session, rank, size, timeout_s, None)
    peers = topology.liveness_peers(config.role, connector.role_rank)
    return _watched(
        connector, world, session, rank, peers,
        lambda error: peer_lost(connector, world, error),
        lambda peer, error: peer_departed(connector, world, peer, error),
    )  # fmt: skip


#: The FFN rank's and the attention rank's numbers on the transports of their link.
FFN_ON_LINK, ATTENTION_ON_LINK = 0, 1

#: Called by a link's peer watch: ``(link world, error)`` when its peer is lost,
#: ``(link world, peer, error)`` when its peer said goodbye.
LinkLost = Callable[["World", AFDPeerError], None]
LinkDeparted = Callable[["World", int, AFDPeerError], None]


def open_link(
    connector: Connector,
    data: DataTransportFactory,
    session: Session,
    attention_rank: int,
    ffn_rank: int,
    generation: int,
    *,
    owns_session: bool,
    on_lost: LinkLost,
    on_departed: LinkDeparted,
) -> World:
    """The link of its own between FFN rank ``ffn_rank`` and attention rank
    ``attention_rank``.

    A world of two ranks (the FFN rank is rank 0, the attention rank rank 1) in the
    session's namespace for this pair and seat ``generation``
    (:meth:`~afd_core.runtime.rendezvous.Session.link`): its own gloo control group, data
    transport and liveness connection, so that losing it leaves every other link of
    either rank untouched. ``owns_session``: releasing the link also closes ``session``
    (on the attention side, for the link released last). Bounded by the AFD timeout;
    closes what it opened when it raises.
    """
    config, topology = connector.config, connector.topology
    timeout_s = float(config.afd_process_group_timeout_s)
    # World ranks by link rank: FFN_ON_LINK first.
    ranks = (topology.world_rank("ffn", ffn_rank), topology.world_rank("attention", attention_rank))
    on_ffn = config.role == "ffn"
    me, peer = (FFN_ON_LINK, ATTENTION_ON_LINK) if on_ffn else (ATTENTION_ON_LINK, FFN_ON_LINK)
    link_session = session.link(attention_rank, ffn_rank, generation)
    world = _open_transports(
        connector, data, link_session, session if owns_session else None, me, 2, timeout_s, ranks
    )
    return _watched(
        connector, world, link_session, me, (peer,),
        lambda error: on_lost(world, error),
        lambda gone, error: on_departed(world, gone, error),
    )  # fmt: skip


def open_ffn_group(connector: Connector, session: Session) -> World:
    """The FFN ranks' own world (every FFN rank, none of the attention ranks), in the
    session's ``ffn/`` namespace: its ranks are the FFN role ranks (which are also their
    world ranks). Expert-routed connectors on links relay steps over its control
    transport (:mod:`afd_core.runtime.control.relay`; its data transport is that gloo group
    under the data tag, whatever the connector's data plane). Losing an FFN rank fails
    the connector, as in a world of every rank. Bounded by the AFD timeout; closes what
    it opened when it raises.
    """
    timeout_s = float(connector.config.afd_process_group_timeout_s)
    size = connector.topology.num_ffn_ranks
    namespace = session.group("ffn")
    rank = connector.role_rank
    world = _open_transports(
        connector, gloo_data_transport, namespace, None, rank, size, timeout_s,
        tuple(range(size)),
    )  # fmt: skip
    peers = tuple(f for f in range(size) if f != rank)
    return _watched(
        connector, world, namespace, rank, peers,
        lambda error: peer_lost(connector, world, error),
        lambda peer, error: peer_departed(connector, world, peer, error),
    )  # fmt: skip


def _open_transports(
    connector: Connector,
    data: DataTransportFactory,
    namespace: Session,
    owned: Session | None,
    rank: int,
    size: int,
    timeout_s: float,
    world_ranks: tuple[int, ...] | None,
) -> World:
    """The control and data transports of ``size`` ranks in ``namespace``, as a World
    that releases ``owned`` last; ``owned`` is closed when this raises."""
    try:
        control = open_gloo(namespace, "control", rank, size, timeout_s)
        try:
            transport = data(namespace, control, rank, size, timeout_s)
        except BaseException:
            control.close()
            raise
    except BaseException:
        if owned is not None:
            owned.close()
        raise
    failures = PeerFailures(connector.topology, timeout_s, connector.fuse, world_ranks)
    return World(owned, control, transport, failures, timeout_s)


def _watched(
    connector: Connector,
    world: World,
    namespace: Session,
    rank: int,
    peers: tuple[int, ...],
    on_lost: Callable[[AFDPeerError], None],
    on_departed: Callable[[int, AFDPeerError], None],
) -> World:
    """``world`` with its peer watch on ``peers`` running; released when this raises or
    when the connector was closed meanwhile (AFDShutdown)."""
    try:
        world.watch = PeerWatch.open(
            namespace, connector.config.host, rank, peers, world.timeout_s,
            world.failures.describe, on_lost, on_departed,
        )  # fmt: skip
    except BaseException:
        world.interrupt()
        world.release()
        raise
    if connector.is_closed:
        world.interrupt()
        world.release()
        raise AFDShutdown(f"AFD: {connector.name} was closed during initialize()")
    return world


def peer_lost(connector: Connector, world: World, error: AFDPeerError) -> None:
    """The watch found a peer gone: fail the connector, wake its waits (those on the
    world's transports and those at step boundaries), tell its owner."""
    if connector.fuse.closed:
        return
    connector.fuse.blow(error)
    world.data.interrupt()
    world.control.interrupt()
    for wake in world.boundary_waiters:
        wake()
    if connector.on_peer_lost is not None:
        connector.on_peer_lost(error)


def peer_departed(connector: Connector, world: World, peer: int, error: AFDPeerError) -> None:
    """A peer closed its connector: fail at the next step boundary, wake waits there."""
    if connector.fuse.closed:
        return
    connector.fuse.depart(error)
    for wake in world.boundary_waiters:
        wake()
    if connector.on_peer_lost is not None:
        connector.on_peer_lost(error)
