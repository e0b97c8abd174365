"""Opening an AFD world: the rendezvous, then the control channel's and the data plane's transports.

Every composed connector starts the same way (:func:`open_world`):

1. the rendezvous of :mod:`afd_core.rendezvous` (FFN rank 0 hosts the store; every rank
   publishes and compares its hello record, so mismatched peers fail here, naming both
   views);
2. the control transport: a :class:`~afd_core.transport.gloo.GlooTransport` on the
   session's ``control/`` prefix (control frames live in host memory on every platform);
3. the data transport, from the connector's :data:`DataTransportFactory` (the control
   group under a second tag for the reference connector, NCCL for afd-connectors-gpu);
4. the :class:`~afd_core.liveness.PeerWatch`: a heartbeat link to every peer. A peer
   that crashed, was killed or went silent fails the connector (its fuse) at once and
   interrupts both transports; a peer that closed its connector (said goodbye) fails it
   at the next step boundary (``Fuse.depart``), so steps in flight with other peers
   finish, and wakes the waits at a step boundary (:attr:`World.boundary_waiters`).
   Either way the connector's ``on_peer_lost`` runs next: the role worker ends itself
   (a wait with no deadline, such as an expert-routed follower FFN rank waiting for its
   leader's next step, ends when the worker closes the connector).

:class:`World` holds them and knows the order in which they go down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from afd_core.errors import AFDPeerError, AFDShutdown
from afd_core.failures import PeerFailures
from afd_core.liveness import PeerWatch
from afd_core.rendezvous import Hello, Session, exchange_hello, open_session
from afd_core.store_gate import rendezvous_secret
from afd_core.transport import Transport
from afd_core.transport.gloo import TAG_DATA, GlooTransport

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

    def should_stop() -> bool:
        return connector.is_closed

    session = open_session(
        config.host, config.port, rank == 0, timeout_s, should_stop, rendezvous_secret()
    )
    try:
        exchange_hello(
            session, Hello.of(config, connector.role_rank, connector.wire), topology,
            timeout_s, should_stop,
        )  # fmt: skip
        control = open_gloo(session, "control", rank, size, timeout_s)
    except BaseException:
        session.close()
        raise
    try:
        transport = data(session, control, rank, size, timeout_s)
    except BaseException:
        control.close()
        session.close()
        raise
    failures = PeerFailures(topology, timeout_s, connector.fuse)
    world = World(session, control, transport, failures, timeout_s)
    try:
        world.watch = PeerWatch.open(
            session, config.host, rank, topology.liveness_peers(config.role, connector.role_rank),
            timeout_s, failures.describe, lambda error: _peer_lost(connector, world, error),
            lambda peer, error: _peer_departed(connector, world, peer, error),
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


def _peer_lost(connector: Connector, world: World, error: AFDPeerError) -> None:
    """The watch found a peer gone: fail the connector, wake its waits, tell its owner."""
    if connector.fuse.closed:
        return
    connector.fuse.blow(error)
    world.data.interrupt()
    world.control.interrupt()
    if connector.on_peer_lost is not None:
        connector.on_peer_lost(error)


def _peer_departed(connector: Connector, world: World, peer: int, error: AFDPeerError) -> None:
    """A peer closed its connector: fail at the next step boundary, wake waits there."""
    if connector.fuse.closed:
        return
    connector.fuse.depart(error)
    for wake in world.boundary_waiters:
        wake()
    if connector.on_peer_lost is not None:
        connector.on_peer_lost(error)
