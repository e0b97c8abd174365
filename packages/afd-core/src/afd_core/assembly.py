"""The assembly API: a connector is a recipe, and one assembler builds every recipe.

A composed connector names five choices (docs/design.md shows the recipe of every
connector in one table):

* **layout** (:class:`Layout`): one world of every rank, or a link of its own per
  (attention rank, FFN rank) pair, so that an attention server can be replaced while its
  FFN ranks keep serving the others;
* **control** (:class:`Control`): the attention ranks announce every step (a
  :class:`~afd_core.wire.metadata.ControlPayload` per step), or nothing is announced and the
  data carries its own counts;
* **data plane**: a :class:`TransportPlane` (the endpoints post tensors on a
  :class:`~afd_core.dataplane.transport.Transport`) or an :class:`OpPlane` (custom ops move the
  data on groups an :class:`~afd_core.dataplane.op_provider.OpProvider` opened, one per stage);
* **pattern** (:class:`Pattern`): who exchanges with whom (its pairing rules) and the
  role endpoints that do it;
* **replay guard** (optional): bounds CUDA graph replays (connectors with graph steps).

:meth:`Connector.connect <afd_core.connector.Connector.connect>` hands the recipe and a
:class:`RuntimeSpec` (what the runtime needs of the connector; never the connector) to
:func:`assemble`. Every part the assembler builds has the same life cycle (interrupt,
join, release), so the connector's shutdown order is derived in one place: every part is
interrupted, then joined, then released, the last built first.

afd-core's own patterns (:data:`P2P_BLOCK`, :data:`EXPERT_ROUTED`) and data planes
(:func:`gloo_data_plane`) are here too; another package adds a pattern by implementing
:class:`Pattern` (an op-plane pattern needs nothing but this module's types), or a
transport by returning a :class:`TransportPlane`. Importing this module imports no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar, Protocol

from afd_core.kit.pairing import ALL_TO_ALL, BLOCK, Pairing

if TYPE_CHECKING:
    from afd_core.config import AFDConfig
    from afd_core.connector import (
        AttentionEndpoint,
        ConnectorParts,
        FFNEndpoint,
        FFNStep,
        WireSpec,
    )
    from afd_core.dataplane.op_provider import GroupOpener, OpProvider
    from afd_core.dataplane.replay_guard import ReplayGuard
    from afd_core.dataplane.transport import Transport
    from afd_core.errors import AFDPeerError
    from afd_core.failures import Fuse, PeerFailures
    from afd_core.kit.endpoint_context import EndpointContext
    from afd_core.kit.peer_links import FFNLinks
    from afd_core.placement import PlacementRule
    from afd_core.topology import Role, Topology
    from afd_core.wire.metadata import ControlPayload


class Layout(Enum):
    """How a connector's ranks are joined (see the module docstring)."""

    WORLD = "world"
    LINKS = "links"


class Control(Enum):
    """Whether the attention ranks announce each step to the FFN ranks."""

    ANNOUNCED = "announced"
    IN_BAND = "in-band"


@dataclass(frozen=True)
class RuntimeSpec:
    """What the runtime needs of a connector: its settings, rank, wire spec and fuse.

    ``peer_lost`` is called (on a connector thread) after a lost peer failed the
    connector and woke its waits.
    """

    name: str
    config: AFDConfig
    role_rank: int
    wire: WireSpec
    fuse: Fuse
    peer_lost: Callable[[AFDPeerError], None]

    @property
    def role(self) -> Role:
        """This rank's role."""
        return self.config.role

    @property
    def topology(self) -> Topology:
        """The deployment's rank map."""
        return self.config.topology

    @property
    def world_rank(self) -> int:
        """This rank in a world of every rank (FFN ranks first)."""
        return self.topology.world_rank(self.config.role, self.role_rank)

    @property
    def timeout_s(self) -> float:
        """The AFD timeout (``afd_process_group_timeout_s``) that bounds every wait."""
        return float(self.config.afd_process_group_timeout_s)


@dataclass(frozen=True)
class TransportSite:
    """What a :data:`TransportFactory` is given to open the data transport of a world.

    ``world_rank``/``world_size``: this rank and the size of the world (a link is a
    world of two: the FFN rank 0, the attention rank 1); ``peers``: the ranks on this
    world this rank exchanges data with; ``control``: the world's open control transport
    (gloo; a data plane on gloo shares its group); ``opener``: the world's namespace of
    the rendezvous store.
    """

    world_rank: int
    world_size: int
    peers: tuple[int, ...]
    timeout_s: float
    control: Transport
    opener: GroupOpener


#: Opens a world's data transport. Collective over the world's ranks; may raise
#: AFDPeerError (a rank did not come) or AFDConfigError (the platform cannot run it).
TransportFactory = Callable[[TransportSite], "Transport"]


@dataclass(frozen=True)
class TransportPlane:
    """A data plane that is a transport: the endpoints post tensors on it."""

    open: TransportFactory


@dataclass(frozen=True)
class OpPlane:
    """A data plane inside custom ops: ``provider()`` makes this rank's
    :class:`~afd_core.dataplane.op_provider.OpProvider`, which opens ``num_stages`` groups (one
    per stage) over the connector's world. Needs :attr:`Layout.WORLD`."""

    provider: Callable[[], OpProvider]
    num_stages: int = 2


DataPlane = TransportPlane | OpPlane


@dataclass(frozen=True)
class ReplayGuardSite:
    """What a :data:`ReplayGuardFactory` is given once the world is open.

    ``fail(what)``: the guard's overrun: fails the connector with an AFDPeerError that
    names the data peer and ``what`` was still running, and ends the pending transfers.
    """

    spec: RuntimeSpec
    fail: Callable[[str], None]


#: Builds a connector's replay guard (connectors with CUDA graph steps). The guard's
#: ``stop()`` runs first when the connector shuts down.
ReplayGuardFactory = Callable[[ReplayGuardSite], "StoppableReplayGuard"]


class StoppableReplayGuard(Protocol):
    """A :class:`~afd_core.dataplane.replay_guard.ReplayGuard` with a ``stop()`` for shutdown."""

    def stop(self) -> None:
        """Stop watching (idempotent); pending watches end."""
        ...


class StepAnnouncer(Protocol):
    """Attention side of the control channel: announce a step to the FFN side."""

    def send(self, payload: ControlPayload) -> None:
        """Send ``payload``; bounded by the AFD timeout; raises AFDPeerError."""
        ...


class StepSource(Protocol):
    """FFN side of the control channel: the next step the attention ranks announced."""

    def next_step(self) -> FFNStep | None:
        """The next step (None once the connector is closed)."""
        ...


@dataclass(frozen=True)
class DataPeer:
    """An FFN rank as an attention rank reaches it on a transport plane: the
    ``transport``, the FFN rank's number ``transport_rank`` on it, and how to name it."""

    ffn_rank: int
    transport: Transport
    transport_rank: int
    failures: PeerFailures


@dataclass(frozen=True)
class AttentionSide:
    """What the assembler hands a pattern to build its attention endpoint.

    ``announcer``: the control channel (None with :attr:`Control.IN_BAND`); ``peers``:
    the FFN ranks of :meth:`Pattern.ffn_peers`, on a transport plane; ``op_groups``: the
    group names by stage, on an op plane; ``context``: what afd-core's own endpoints
    share (an ``afd_core.kit.endpoint_context.EndpointContext``; None on an op
    plane); ``replays``: the replay guard, if the recipe has one.
    """

    spec: RuntimeSpec
    announcer: StepAnnouncer | None
    peers: tuple[DataPeer, ...] = ()
    op_groups: tuple[str, ...] = ()
    context: EndpointContext | None = None
    replays: ReplayGuard | None = None

    def transport_context(self) -> EndpointContext:
        """:attr:`context`, for a pattern whose data plane is a transport plane
        (ValueError on an op plane, where there is none)."""
        if self.context is None:
            raise ValueError("AFD: this side has no endpoint context (an op-plane pattern)")
        return self.context


@dataclass(frozen=True)
class FFNSide:
    """What the assembler hands a pattern to build its FFN endpoint.

    ``steps``: the announced steps (the control inbox, or the step relay where the
    pattern relays steps; None with :attr:`Control.IN_BAND`); ``links``: the links to
    the attention ranks of :meth:`Pattern.attention_peers` (control and, on a transport
    plane, data; :class:`~afd_core.kit.peer_links.FFNLinks`); ``op_groups``, ``context``
    and ``replays`` as for :class:`AttentionSide`.
    """

    spec: RuntimeSpec
    steps: StepSource | None
    links: FFNLinks
    op_groups: tuple[str, ...] = ()
    context: EndpointContext | None = None
    replays: ReplayGuard | None = None

    def transport_context(self) -> EndpointContext:
        """:attr:`context`, for a pattern whose data plane is a transport plane
        (ValueError on an op plane, where there is none)."""
        if self.context is None:
            raise ValueError("AFD: this side has no endpoint context (an op-plane pattern)")
        return self.context


class Pattern(ABC):
    """An exchange pattern: its pairing rules, the facts that follow from them, and its
    role endpoints.

    The class-level facts are read before any connector exists (config validation and
    ``afd check`` read them from the connector's :attr:`Connector.pattern_type
    <afd_core.connector.Connector.pattern_type>`), so they are class variables:

    * ``expert_placement``: None when every FFN rank holds every expert (the block
      pairing of :mod:`afd_core.kit.pairing`: each FFN rank serves a block of attention
      ranks), else the rule that splits the routed experts over the FFN ranks
      (:mod:`afd_core.placement`; the all-to-all pairing);
    * ``gate_on_attention``: None when the pattern takes either gate placement, else the
      ``compute_gate_on_attention`` its messages need, ``gate_reason`` saying why;
    * ``controls``: the control slots its endpoints work with (afd-core's patterns need
      announced steps; a pattern of :attr:`Control.IN_BAND` only serves attention ranks
      that step on their own, so its deployments set ``async_dp``);
    * ``data_plane``: the kind of data plane its endpoints use (:class:`TransportPlane`
      or :class:`OpPlane`);
    * ``relays_steps``: the attention ranks announce every step to FFN rank 0, which
      relays it to the other FFN ranks (every FFN rank then runs every step); otherwise
      each attention rank announces to the FFN ranks it exchanges with.
    """

    name: ClassVar[str] = ""
    expert_placement: ClassVar[PlacementRule | None] = None
    gate_on_attention: ClassVar[bool | None] = None
    gate_reason: ClassVar[str] = ""
    data_plane: ClassVar[type[TransportPlane] | type[OpPlane]] = TransportPlane
    controls: ClassVar[tuple[Control, ...]] = (Control.ANNOUNCED,)
    relays_steps: ClassVar[bool] = False

    @classmethod
    def pairing(cls) -> Pairing:
        """The pairing this pattern's rank map uses (:mod:`afd_core.kit.pairing`): blocks
        when every FFN rank holds every expert, else all-to-all."""
        return BLOCK if cls.expert_placement is None else ALL_TO_ALL

    @classmethod
    def in_band(cls) -> bool:
        """True when the pattern works without announced steps only (async DP)."""
        return cls.controls == (Control.IN_BAND,)

    def check(self, spec: RuntimeSpec) -> None:
        """Raise AFDConfigError when ``spec`` cannot run this pattern (default: nothing)."""
        return None

    def ffn_peers(self, topology: Topology, attention_rank: int) -> tuple[int, ...]:
        """The FFN ranks ``attention_rank`` exchanges data with, in FFN rank order.

        The default is the rank map's (``topology``, built from :attr:`expert_placement`):
        the FFN rank serving its block, or every FFN rank when the experts are split.
        """
        return topology.ffn_ranks_of(attention_rank)

    def attention_peers(self, topology: Topology, ffn_rank: int) -> tuple[int, ...]:
        """The attention ranks ``ffn_rank`` exchanges data with, in rank order (the
        default: its block of the rank map, every attention rank when the experts are
        split)."""
        return tuple(topology.block_of(ffn_rank))

    def announce_to(self, topology: Topology, attention_rank: int) -> tuple[int, ...]:
        """The FFN ranks ``attention_rank`` announces its steps to."""
        if self.relays_steps:
            return (0,)
        return self.ffn_peers(topology, attention_rank)

    def announcers_of(self, topology: Topology, ffn_rank: int) -> tuple[int, ...]:
        """The attention ranks whose announcements ``ffn_rank`` receives."""
        if self.relays_steps:
            return tuple(range(topology.num_attention_ranks)) if ffn_rank == 0 else ()
        return self.attention_peers(topology, ffn_rank)

    def liveness_peers(self, topology: Topology, role: Role, role_rank: int) -> tuple[int, ...]:
        """World ranks whose loss ``role_rank`` must notice: its data peers and, where
        steps are relayed, the other FFN ranks of an FFN rank."""
        if role == "attention":
            return tuple(topology.world_rank("ffn", f) for f in self.ffn_peers(topology, role_rank))
        peers = tuple(
            topology.world_rank("attention", a) for a in self.attention_peers(topology, role_rank)
        )
        if self.relays_steps:
            others = tuple(f for f in range(topology.num_ffn_ranks) if f != role_rank)
            peers = tuple(topology.world_rank("ffn", f) for f in others) + peers
        return peers

    @abstractmethod
    def attention_endpoint(self, side: AttentionSide) -> AttentionEndpoint:
        """This pattern's attention endpoint on ``side``."""

    @abstractmethod
    def ffn_endpoint(self, side: FFNSide) -> FFNEndpoint:
        """This pattern's FFN endpoint on ``side``."""


@dataclass(frozen=True)
class Recipe:
    """A composed connector (see the module docstring)."""

    layout: Layout
    control: Control
    data: DataPlane
    pattern: Pattern
    replay_guard: ReplayGuardFactory | None = None


def assemble(spec: RuntimeSpec, recipe: Recipe) -> ConnectorParts:
    """Rendezvous as ``spec``'s rank and build ``recipe``'s parts and role endpoint.

    Bounded by the AFD timeout; ``spec.fuse`` closing meanwhile makes it raise
    AFDShutdown. Raises AFDConfigError for a recipe whose parts do not fit together
    (an op plane on links, a pattern given the other kind of data plane), and what the
    rendezvous raises (AFDProtocolError for mismatched peers, AFDPeerError for a rank
    that does not come). Whatever it built is taken down again when it raises.
    """
    from afd_core.runtime.assembler import assemble as run

    return run(spec, recipe)


def gloo_data_plane() -> TransportPlane:
    """The data plane over gloo: the world's control group, under a tag of its own."""
    from afd_core.runtime.gloo import shared_data_transport

    return TransportPlane(shared_data_transport)


def __getattr__(name: str) -> Pattern | type[Pattern]:
    """afd-core's patterns and their classes, imported on first use: ``P2P_BLOCK``
    (:class:`P2pBlock`: each FFN rank serves a contiguous block of attention ranks) and
    ``EXPERT_ROUTED`` (:class:`ExpertRouted`: routed experts in blocks over the FFN
    ranks; every attention rank exchanges with every FFN rank)."""
    if name in ("P2P_BLOCK", "P2pBlock"):
        from afd_core.runtime import p2p

        return getattr(p2p, name)  # type: ignore[no-any-return]
    if name in ("EXPERT_ROUTED", "ExpertRouted"):
        from afd_core.runtime import expert

        return getattr(expert, name)  # type: ignore[no-any-return]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
