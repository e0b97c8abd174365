"""Opening an AFD world: the rendezvous, then its control transport and data plane.

A world is a set of ranks with a control transport, a data plane and a peer watch of
their own: one world of every rank (:func:`open_world`), a world of two per (attention
rank, FFN rank) pair (:func:`open_link_world`, after :func:`join_session`), or the FFN ranks'
own world (:func:`open_ffn_group`). Each opens the same way:

1. the rendezvous of :mod:`afd_core.runtime.rendezvous` (FFN rank 0 hosts the store; every
   rank publishes and compares its hello record, so mismatched peers fail here, naming
   both views);
2. the control transport: a :class:`~afd_core.runtime.gloo.GlooTransport` on the
   namespace's ``control/`` prefix (control messages live in host memory on every
   platform);
3. the data plane: a transport from the recipe's
   :class:`~afd_core.assembly.TransportPlane` (gloo shares the control group under a
   second tag; NCCL in afd-connectors-gpu), or an op provider's groups
   (:class:`~afd_core.assembly.OpPlane`; opened by the assembler on :class:`World.opener`);
4. the :class:`~afd_core.runtime.liveness.PeerWatch`: a heartbeat connection to every peer. A
   peer that crashed, was killed or went silent fails the connector (its fuse) at once
   and interrupts the data plane and the control transport; a peer that closed its
   connector (said goodbye) fails it at the next step boundary (``Fuse.depart``), so
   steps in flight with other peers finish, and wakes the waits at a step boundary
   (:attr:`World.boundary_waiters`). (On a link the caller decides instead: an FFN rank
   may let the link go, see :mod:`afd_core.runtime.links`.) Either way the spec's
   ``peer_lost`` runs next: the role worker ends itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from afd_core.assembly import TransportSite
from afd_core.dataplane.op_provider import GroupOpener
from afd_core.errors import AFDPeerError, AFDShutdown
from afd_core.failures import PeerFailures
from afd_core.runtime.gloo import GlooTransport
from afd_core.runtime.liveness import PeerWatch
from afd_core.runtime.parts import Part
from afd_core.runtime.rendezvous import Hello, Session, exchange_hello, open_session
from afd_core.runtime.store_gate import rendezvous_secret

if TYPE_CHECKING:
    from torch.distributed import Store

    from afd_core.assembly import RuntimeSpec, TransportFactory
    from afd_core.dataplane.op_provider import OpProvider
    from afd_core.dataplane.transport import Transport


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


class SessionOpener(GroupOpener):
    """Groups of the ``size`` ranks of a world in the namespace ``session``."""

    def __init__(self, session: Session, rank: int, size: int, timeout_s: float) -> None:
        self._session, self._rank, self._size, self._timeout_s = session, rank, size, timeout_s

    @property
    def address(self) -> str:
        return self._session.address

    def prefix_store(self, name: str) -> Store:
        return self._session.prefix_store(name)

    def open_gloo(self, name: str) -> Transport:
        return open_gloo(self._session, name, self._rank, self._size, self._timeout_s)


@dataclass
class World:
    """An open AFD world as one rank sees it.

    ``data`` is None when the data plane is an op provider's (``provider``, set by the
    assembler once it opened its groups on ``opener``). The rendezvous session it was
    opened in is a part of its own (the assembler's), released after every world.
    """

    control: Transport
    data: Transport | None
    failures: PeerFailures
    timeout_s: float
    opener: GroupOpener | None = None
    provider: OpProvider | None = None
    watch: PeerWatch | None = None
    #: Wake a wait at a step boundary (it then checks ``Fuse.check_departure``).
    boundary_waiters: list[Callable[[], None]] = field(default_factory=list)

    def interrupt_data(self) -> None:
        """Wake every wait on the data plane (a transport's, or an op provider's ops)."""
        if self.data is not None:
            self.data.interrupt()
        if self.provider is not None:
            self.provider.interrupt()

    def interrupt(self) -> None:
        """Tell the peers this rank leaves, wake every wait on the data plane and the
        control transport (first step of shutting down)."""
        if self.watch is not None:
            self.watch.close()
        self.interrupt_data()
        self.control.interrupt()

    def release(self) -> None:
        """Close the data plane and the control transport, and drop the opener: the
        rendezvous store goes with its last reference (last step)."""
        if self.provider is not None:
            self.provider.close()
        if self.data is not None:
            self.data.close()
        self.control.close()
        self.opener = None

    def as_part(self, name: str) -> Part:
        """This world in a connector's :class:`~afd_core.runtime.parts.Parts`."""
        return Part(name, interrupt=self.interrupt, release=self.release)


def join_session(
    spec: RuntimeSpec, peers: tuple[int, ...], seated: bool = False
) -> tuple[Session, int]:
    """Open (FFN rank 0: host) the rendezvous session and exchange hello records, those
    of ``peers`` (world ranks) first.

    Returns the session and the generation of the seat this rank took (``seated``: see
    :func:`~afd_core.runtime.rendezvous.exchange_hello`; 0 otherwise). Bounded by the AFD
    timeout; the spec's fuse closing meanwhile makes it raise AFDShutdown. Raises what
    the rendezvous raises; the session is closed again then.
    """
    config = spec.config

    def should_stop() -> bool:
        return spec.fuse.closed

    session = open_session(
        config.host, config.port, spec.world_rank == 0, spec.timeout_s, should_stop,
        rendezvous_secret(),
    )  # fmt: skip
    try:
        generation = exchange_hello(
            session, Hello.of(config, spec.role_rank, spec.wire), spec.topology, peers,
            spec.timeout_s, should_stop, seated,
        )  # fmt: skip
    except BaseException:
        session.close()
        raise
    return session, generation


#: The FFN rank's and the attention rank's numbers on the transports of their link.
FFN_ON_LINK, ATTENTION_ON_LINK = 0, 1

#: Called by a link's peer watch: ``(link world, error)`` when its peer is lost,
#: ``(link world, peer, error)`` when its peer said goodbye.
LinkLost = Callable[["World", AFDPeerError], None]
LinkDeparted = Callable[["World", int, AFDPeerError], None]


def open_world(
    spec: RuntimeSpec,
    session: Session,
    data: TransportFactory | None,
    data_peers: tuple[int, ...],
    liveness_peers: tuple[int, ...],
) -> World:
    """The world of every rank in ``session``: control transport, data transport (from
    ``data``; None: an op provider's, opened later on the world's opener) with
    ``data_peers`` (world ranks), and a peer watch on ``liveness_peers``.

    Losing a watched peer fails the connector. Bounded by the AFD timeout; closes what
    it opened when it raises (never ``session``, which the caller owns).
    """
    rank, size = spec.world_rank, spec.topology.world_size
    world = _open_transports(spec, data, session, rank, size, data_peers, None)
    return _watched(
        spec, world, session, rank, liveness_peers,
        lambda error: peer_lost(spec, world, error),
        lambda peer, error: peer_departed(spec, world, peer, error),
    )  # fmt: skip


def open_link_world(
    spec: RuntimeSpec,
    data: TransportFactory,
    session: Session,
    attention_rank: int,
    ffn_rank: int,
    generation: int,
    *,
    on_lost: LinkLost,
    on_departed: LinkDeparted,
) -> World:
    """The link of its own between FFN rank ``ffn_rank`` and attention rank
    ``attention_rank``.

    A world of two ranks (the FFN rank is rank 0, the attention rank rank 1) in the
    session's namespace for this pair and seat ``generation``
    (:meth:`~afd_core.runtime.rendezvous.Session.link`): its own gloo control group,
    data transport and liveness connection, so that losing it leaves every other link
    of either rank untouched. Bounded by the AFD timeout; closes what it opened when it
    raises.
    """
    topology = spec.topology
    # World ranks by link rank: FFN_ON_LINK first.
    ranks = (topology.world_rank("ffn", ffn_rank), topology.world_rank("attention", attention_rank))
    on_ffn = spec.role == "ffn"
    me, peer = (FFN_ON_LINK, ATTENTION_ON_LINK) if on_ffn else (ATTENTION_ON_LINK, FFN_ON_LINK)
    link_session = session.link(attention_rank, ffn_rank, generation)
    world = _open_transports(spec, data, link_session, me, 2, (peer,), ranks)
    return _watched(
        spec, world, link_session, me, (peer,),
        lambda error: on_lost(world, error),
        lambda gone, error: on_departed(world, gone, error),
    )  # fmt: skip


def open_ffn_group(spec: RuntimeSpec, session: Session) -> World:
    """The FFN ranks' own world (every FFN rank, none of the attention ranks), in the
    session's ``ffn/`` namespace: its ranks are the FFN role ranks (which are also their
    world ranks). Patterns that relay steps do it over its control transport on links
    (:mod:`afd_core.runtime.control.relay`); it has no data plane. Losing an FFN rank
    fails the connector, as in a world of every rank. Bounded by the AFD timeout; closes
    what it opened when it raises.
    """
    size = spec.topology.num_ffn_ranks
    namespace = session.group("ffn")
    rank = spec.role_rank
    world = _open_transports(spec, None, namespace, rank, size, (), tuple(range(size)))
    peers = tuple(f for f in range(size) if f != rank)
    return _watched(
        spec, world, namespace, rank, peers,
        lambda error: peer_lost(spec, world, error),
        lambda peer, error: peer_departed(spec, world, peer, error),
    )  # fmt: skip


def _open_transports(
    spec: RuntimeSpec,
    data: TransportFactory | None,
    namespace: Session,
    rank: int,
    size: int,
    data_peers: tuple[int, ...],
    world_ranks: tuple[int, ...] | None,
) -> World:
    """The control and data transports of ``size`` ranks in ``namespace``, as a World;
    what it opened is closed again when it raises."""
    timeout_s = spec.timeout_s
    opener = SessionOpener(namespace, rank, size, timeout_s)
    control = open_gloo(namespace, "control", rank, size, timeout_s)
    try:
        site = TransportSite(rank, size, data_peers, timeout_s, control, opener)
        transport = None if data is None else data(site)
    except BaseException:
        control.close()
        raise
    failures = PeerFailures(spec.topology, timeout_s, spec.fuse, world_ranks)
    return World(control, transport, failures, timeout_s, opener)


def _watched(
    spec: RuntimeSpec,
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
            namespace, spec.config.host, rank, peers, world.timeout_s,
            world.failures.describe, on_lost, on_departed,
        )  # fmt: skip
    except BaseException:
        world.interrupt()
        world.release()
        raise
    if spec.fuse.closed:
        world.interrupt()
        world.release()
        raise AFDShutdown(f"AFD: {spec.name} was closed during initialize()")
    return world


def peer_lost(spec: RuntimeSpec, world: World, error: AFDPeerError) -> None:
    """The watch found a peer gone: fail the connector, wake its waits (those on the
    world's data plane and control transport and those at step boundaries), tell the
    role worker."""
    if spec.fuse.closed:
        return
    spec.fuse.blow(error)
    world.interrupt_data()
    world.control.interrupt()
    for wake in world.boundary_waiters:
        wake()
    spec.peer_lost(error)


def peer_departed(spec: RuntimeSpec, world: World, peer: int, error: AFDPeerError) -> None:
    """A peer closed its connector: fail at the next step boundary, wake waits there."""
    if spec.fuse.closed:
        return
    spec.fuse.depart(error)
    for wake in world.boundary_waiters:
        wake()
    spec.peer_lost(error)
