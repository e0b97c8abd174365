"""The connector contract: how the attention role and the FFN role exchange data.

A connector is one rank's endpoint of an AFD world, composed of parts chosen once, at
construction (docs/design.md): a *control channel* (per-step announcements, absent for
connectors whose data messages carry their own counts), a *data transport*
(:mod:`afd_core.dataplane.transport`) and a *role endpoint*: an :class:`AttentionEndpoint` on the
attention role, an :class:`FFNEndpoint` on the FFN role. The endpoint owns the wire
protocol, headers included: callers give layers, stages and tensors, never a header.

Life cycle:

1. ``__init__`` stores the configuration and parses ``connector_extra_config`` strictly;
   it creates **no** communication resources (so it can be built anywhere, for example
   by ``afd check``).
2. :meth:`Connector.initialize` calls the subclass's :meth:`Connector.connect`: the
   rendezvous with the peers (checking that both sides agree on configuration and model
   shape) and the construction of the parts. Idempotent, bounded by
   ``afd_process_group_timeout_s``.
3. Data-plane calls through :attr:`Connector.attention` or :attr:`Connector.ffn`, per
   decoder layer and stage (see the endpoint classes).
4. :meth:`Connector.close` releases everything; it is idempotent, safe before
   :meth:`initialize` and after a half-finished one, and wakes up any thread blocked in a
   connector call (that call raises :class:`~afd_core.errors.AFDShutdown`).

Contract version: afd-core 0.3 (a connector class names its ``pattern_type`` and its
``capabilities``, which its registration no longer carries; the 0.1 contract's
header-taking ``send_hidden`` / ``recv_output`` and ``control_plane`` are gone; see
docs/plugins.md).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from afd_core.capabilities import Capabilities
from afd_core.errors import AFDConfigError, AFDPeerError, AFDShutdown
from afd_core.failures import Fuse
from afd_core.wire.metadata import WIRE_DTYPES, ControlPayload

if TYPE_CHECKING:
    import torch

    from afd_core.assembly import Pattern, Recipe, RuntimeSpec
    from afd_core.config import AFDConfig


@dataclass(frozen=True)
class WireSpec:
    """The shapes both roles must agree on; part of the rendezvous check.

    ``num_exchange_layers``: decoder layers that exchange per step. ``router_logits_width``
    is the number of routed experts when the gate runs on attention, else 0.
    ``dense_layers``: layers with a dense MLP (no router), whose messages never carry
    router logits (DeepSeek's first ``first_k_dense_replace`` layers).
    ``model_fingerprint`` identifies the checkpoint (architecture and sizes).
    ``num_experts`` and ``top_k``: routed experts and experts per token (0 for a dense
    model); expert-routed connectors need them. ``exchange_layer_ids``: the decoder
    layers that exchange, in call order, when they are not simply
    ``0..num_exchange_layers-1`` (expert-routed connectors exchange MoE layers only).
    """

    hidden_size: int
    dtype: str
    num_exchange_layers: int
    router_logits_width: int = 0
    router_logits_dtype: str = "float32"
    model_fingerprint: str = ""
    dense_layers: tuple[int, ...] = ()
    num_experts: int = 0
    top_k: int = 0
    exchange_layer_ids: tuple[int, ...] = ()
    max_num_batched_tokens: int = 0

    def __post_init__(self) -> None:
        ids = self.exchange_layer_ids
        if ids and len(ids) != self.num_exchange_layers:
            raise ValueError(
                f"WireSpec: exchange_layer_ids {ids} name {len(ids)} layers, "
                f"num_exchange_layers is {self.num_exchange_layers}"
            )

    @property
    def exchange_layers(self) -> tuple[int, ...]:
        """The layers that exchange per step, in call order."""
        return self.exchange_layer_ids or tuple(range(self.num_exchange_layers))

    def logits_width_at(self, layer: int) -> int:
        """Router-logit columns of ``layer``'s attention-to-FFN message (0: none)."""
        return 0 if layer in self.dense_layers else self.router_logits_width


@dataclass(frozen=True)
class FFNStep:
    """One step as the FFN rank runs it: the attention ranks taking part and their counts.

    ``payloads`` are in sender order; ``tokens[i][s]`` is the token count of
    ``attention_ranks[i]`` in stage ``s``.
    """

    payloads: tuple[ControlPayload, ...]
    attention_ranks: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]

    @property
    def num_stages(self) -> int:
        """Stages of this step (the same for every taking part attention rank)."""
        return len(self.tokens[0])

    @property
    def is_graph_capturing(self) -> bool:
        """Any taking part rank captures a CUDA graph."""
        return any(p.is_graph_capturing for p in self.payloads)

    @property
    def is_graph_step(self) -> bool:
        """The taking part ranks run (or capture) CUDA graphs: header-less data messages.

        A step never mixes graph and eager ranks (the FFN side forms steps of one kind).
        """
        return self.payloads[0].is_graph_step

    def stage_tokens(self, stage: int) -> tuple[int, ...]:
        """Token counts of every taking part rank in ``stage``, sender order."""
        return tuple(t[stage] for t in self.tokens)


@dataclass(slots=True)
class ExpertRouting:
    """The routed experts of each row: ``topk_ids`` and ``topk_weights``, ``[rows, top_k]``.

    On the attention side (what the gate and router chose) the ids are global expert
    ids, int32, and the weights float32, as vLLM's router returns them. In an
    :class:`FFNLayerBatch` the ids are the FFN rank's *local* expert ids (0-based within
    its block) and a slot whose expert lives elsewhere has weight 0 and the id of an
    expert this rank owns (see :mod:`afd_core.placement`).
    """

    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


@dataclass(slots=True)
class FFNLayerBatch:
    """The FFN input of one layer and stage: the rows of every attention rank, concatenated.

    ``splits[i]`` rows belong to ``step.attention_ranks[i]``. ``router_logits`` is given
    when the gate runs on attention and the connector sends logits (P2P); ``routing``
    when the connector routes rows to expert owners (expert-routed). The tensors stay
    valid until the next ``recv`` of the same stage.
    """

    step: FFNStep
    layer: int
    stage: int
    hidden: torch.Tensor
    splits: tuple[int, ...]
    router_logits: torch.Tensor | None = None
    routing: ExpertRouting | None = None


class AttentionEndpoint(ABC):
    """The attention side of a connector: announce steps, send layers, receive results.

    Per step: :meth:`begin_step`, then for every exchanging layer and stage a
    :meth:`send` and, later, the matching :meth:`recv`. Sends and receives pair up per
    stage; the stages of a step may interleave (``send(L, 0)``, ``send(L, 1)``,
    ``recv(L, 0)``, ``recv(L, 1)``), and a connector may collect a layer's result at the
    next layer. Every step exchanges every layer of the wire spec in every stage:
    anything else raises AFDProtocolError. Called from one thread.
    """

    @abstractmethod
    def begin_step(self, payload: ControlPayload) -> None:
        """Start the step ``payload`` describes (step id, token counts per stage, flags).

        Raises AFDProtocolError while the previous step is incomplete.
        """

    @abstractmethod
    def send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        *,
        router_logits: torch.Tensor | None = None,
        routing: ExpertRouting | None = None,
    ) -> None:
        """Send ``layer``'s hidden states of ``stage`` (``[tokens, hidden]``, contiguous).

        ``router_logits`` go with them exactly when the wire spec has logits at
        ``layer`` (P2P with the gate on attention); ``routing`` is required by
        expert-routed connectors. The tensors must stay unchanged until the matching
        :meth:`recv` returned.
        """

    @abstractmethod
    def recv(self, layer: int, stage: int) -> torch.Tensor:
        """The FFN result of ``layer`` and ``stage``: a new tensor shaped like the hidden
        states sent, owned by the caller (it aliases no buffer of the connector)."""

    def graph_capture(self) -> AbstractContextManager[None]:
        """A context around the capture of CUDA graphs in this process.

        Entering waits (bounded) for the replays still running; inside, the connector
        makes no CUDA call from its own threads. The default does nothing (a connector
        without graph steps has no replays).
        """
        return nullcontext()

    def watch_graph_replay(self, step_id: int) -> None:
        """Bound the CUDA graph replay of ``step_id`` just queued on the stream.

        Returns at once; should the replay not finish within the AFD timeout, the
        connector fails and ends its pending transfers, so the next call raises
        AFDPeerError. Connectors whose capabilities have ``cuda_graphs`` implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graph steps")

    def stats(self) -> dict[str, Any]:
        """Counters of this endpoint (JSON-friendly; the default has none)."""
        return {}


class FFNEndpoint(ABC):
    """The FFN side of a connector: take a step, receive each layer, send each result.

    Per step from :meth:`next_step`, layer-major: for each exchanging layer, for each
    stage, :meth:`recv` then :meth:`send` (``recv(L, 0)``, ``send(L, 0)``, ``recv(L, 1)``,
    ``send(L, 1)``, then layer L+1). This is the only order that serves every order the
    :class:`AttentionEndpoint` allows: with two stages in flight an attention rank sends
    both stages of layer L before it collects either result, so an FFN loop that finished
    stage 0's layers first would wait for layer L+1 of stage 0 while the attention rank
    waits for layer L of stage 1. Called from one thread (the FFN loop);
    :meth:`next_step` returns None once the connector is closed.
    """

    @abstractmethod
    def next_step(self) -> FFNStep | None:
        """Wait for the next step (as long as the attention ranks are idle).

        Returns None once the connector is closed. Raises AFDPeerError when an attention
        rank disconnects, AFDProtocolError for an announcement that breaks the rules.
        """

    @abstractmethod
    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """Receive ``layer``'s input of ``stage`` from every attention rank of ``step``."""

    @abstractmethod
    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Send each attention rank its rows of ``output`` (``[sum(batch.splits), hidden]``).

        Returns once every part is sent (a closing FFN rank never drops a result).
        """

    # CUDA graph steps (connectors whose capabilities have cuda_graphs) ----------------
    #
    # In a step whose payloads have ``is_graph_step`` the attention ranks' forwards are
    # CUDA graphs. The FFN rank serves such a step with buffers it owns (so that a graph
    # it captures keeps fixed addresses), in the same layer-major order (recv_into then
    # send_from); these calls may themselves be captured.

    def recv_into(
        self,
        step: FFNStep,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
    ) -> None:
        """Graph step: receive ``layer``'s input of every rank into ``hidden`` (block order).

        ``router_logits`` likewise, exactly when the wire spec has logits at ``layer``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graph steps")

    def send_from(self, step: FFNStep, layer: int, stage: int, output: torch.Tensor) -> None:
        """Graph step: send each rank its rows of ``output``."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graph steps")

    def wait_for_stream(self, what: str) -> None:
        """Wait (bounded by the AFD timeout) until the current stream's work is done.

        Called after replaying a captured step; raises AFDPeerError (and fails the
        connector) past the timeout, AFDShutdown when the connector is closed.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graph steps")

    def stats(self) -> dict[str, Any]:
        """Counters of this endpoint (JSON-friendly; the default has none)."""
        return {}


@dataclass(slots=True)
class FFNWorkItem:
    """One unit of in-band work: the rows one attention rank sent for one layer on one lane.

    ``hidden`` ``[rows, hidden]`` and ``routing`` (local expert ids, and the weights the
    FFN rank applies: 1.0 where the attention rank applies the router weights itself) as
    :meth:`~afd_models.roles.FFNModel.afd_compute_experts` takes them; ``handle`` is the
    endpoint's own record of where the result goes (opaque to the caller). Valid until the
    next :meth:`FFNWorkEndpoint.next_work` of the same lane.
    """

    attention_rank: int
    layer: int
    lane: int
    hidden: torch.Tensor
    routing: ExpertRouting
    handle: Any = None


class FFNWorkEndpoint(ABC):
    """The FFN side of an in-band connector (no control plane): work items, not steps.

    The attention ranks announce nothing; each data message carries its own counts, so the
    FFN rank forms its work from whatever arrives: on each of :attr:`num_lanes` lanes (one
    per stage the attention ranks may have in flight), :meth:`next_work` returns the next
    item that arrived from any attention rank, and :meth:`send_work` returns its result to
    that rank. Each lane is served by one thread, in arrival order (``next_work``, compute,
    ``send_work``, repeat); lanes are independent, so an attention rank's two stages never
    wait on each other. :meth:`next_work` returns None once the connector is closed.
    """

    @property
    @abstractmethod
    def num_lanes(self) -> int:
        """The lanes to serve, each on its own thread."""

    @abstractmethod
    def next_work(self, lane: int) -> FFNWorkItem | None:
        """Wait for the next work item on ``lane`` (as long as the attention ranks are idle).

        Returns None once the connector is closed. Raises AFDPeerError when an attention
        rank is lost, AFDProtocolError for a message that breaks the rules.
        """

    @abstractmethod
    def send_work(self, item: FFNWorkItem, output: torch.Tensor) -> None:
        """Return ``output`` (``[rows, hidden]``, one row per row of ``item.hidden``) to the
        attention rank that sent ``item``."""

    def stats(self) -> dict[str, Any]:
        """Counters of this endpoint (JSON-friendly; the default has none)."""
        return {}


@dataclass(frozen=True)
class ConnectorParts:
    """What :meth:`Connector.connect` built: the role endpoint and how to take it down.

    ``shutdown`` runs in order on :meth:`Connector.close`: first whatever wakes blocked
    waits (interrupting transports), then joining threads, then releasing groups and
    the rendezvous store. Each step must be idempotent and must not raise.
    """

    endpoint: AttentionEndpoint | FFNEndpoint | FFNWorkEndpoint
    shutdown: tuple[Callable[[], None], ...] = ()


class Connector:
    """Base class of every AFD connector (built-in and third-party).

    Subclasses set ``name`` (the value users put in ``"connector"``) and
    ``pattern_type``, implement :meth:`recipe` (a composed connector:
    :mod:`afd_core.assembly`) or override :meth:`connect` (a connector that builds its own
    parts), and may set ``capabilities`` and override :meth:`parse_extra_config` to
    accept ``connector_extra_config`` fields. Everything else (life cycle, the closed
    and failed state, the endpoint accessors) lives here.
    """

    name: ClassVar[str] = ""
    #: The class of the pattern its recipe names (a connector without a recipe: the
    #: pattern whose rules it follows). The rank map, the expert split, the gate
    #: placement and whether steps are announced are read from it, before any connector
    #: is built (:mod:`afd_core.capabilities`); :meth:`connect` refuses a recipe whose
    #: pattern is not one.
    pattern_type: ClassVar[type[Pattern]]
    #: What its data plane can carry (CUDA graphs, two stages, attention TP).
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: The data plane sizes its buffers from the most tokens one step carries: the role
    #: workers put vLLM's ``max_num_batched_tokens`` into the wire spec
    #: (:attr:`WireSpec.max_num_batched_tokens`), so both roles must agree on it.
    sized_by_max_num_batched_tokens: ClassVar[bool] = False

    @property
    def replaces_attention_ranks(self) -> bool:
        """True when an attention rank that leaves can be replaced by a new server while
        the FFN ranks keep serving the others (the FFN role then never starts a new
        rendezvous; see afd_core.runtime.links): a recipe on links. False otherwise (and
        for connectors without a recipe): the FFN rank fails when an attention rank
        leaves, and the FFN role starts a new rendezvous for all of them."""
        from afd_core.assembly import Layout

        try:
            return self.recipe().layout is Layout.LINKS
        except NotImplementedError:
            return False

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        for dtype in (wire.dtype, wire.router_logits_dtype):
            if dtype not in WIRE_DTYPES:
                raise AFDConfigError(
                    f"AFD wire: dtype {dtype!r} cannot travel on the wire; use one of "
                    f"{sorted(WIRE_DTYPES)} (--dtype of both roles)"
                )
        self.config = config
        self.role_rank = role_rank
        self.wire = wire
        self.topology = config.topology
        self.world_rank = self.topology.world_rank(config.role, role_rank)
        self.extra = type(self).parse_extra_config(config.connector_extra_config)
        #: Shared by every part: closed, or failed with an error (see afd_core.failures).
        self.fuse = Fuse(self.name or type(self).__name__)
        #: Called (on a connector thread) when a peer is found gone, after the connector
        #: was failed and its waits woken; the role worker sets it (e.g. to end itself).
        self.on_peer_lost: Callable[[AFDPeerError], None] | None = None
        self._lifecycle_lock = threading.Lock()
        self._parts: ConnectorParts | None = None

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> Any:
        """Parse ``connector_extra_config`` strictly; the default accepts only ``{}``.

        Raise AFDConfigError naming each unknown field.
        """
        if raw:
            raise AFDConfigError(
                f"AFD config: connector_extra_config has fields {sorted(raw)} but "
                f"{cls.name or cls.__name__} takes none; remove them"
            )
        return None

    @classmethod
    def stages_fixed_by(cls, extra: Any) -> int | None:
        """The stages per step that the parsed ``connector_extra_config`` ``extra`` fixes
        (a connector whose own key turns micro-batch stages on), or None when
        ``num_stages`` decides (the default). Config validation refuses a ``num_stages``
        that differs from a fixed count."""
        return None

    def recipe(self) -> Recipe:
        """The recipe this connector is assembled from (:mod:`afd_core.assembly`).

        Cheap and free of side effects (it is also read by :attr:`replaces_attention_ranks`
        and ``afd check``). Raises NotImplementedError in a connector that overrides
        :meth:`connect` instead.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no recipe(); implement recipe() or connect()"
        )

    def runtime_spec(self) -> RuntimeSpec:
        """What the runtime needs of this connector (never the connector itself)."""
        from afd_core.assembly import RuntimeSpec

        return RuntimeSpec(
            self.name or type(self).__name__, self.config, self.role_rank, self.wire,
            self.fuse, self._tell_peer_lost,
        )  # fmt: skip

    def connect(self) -> ConnectorParts:
        """Rendezvous with the peers and build this rank's parts; called once.

        The default assembles :meth:`recipe` (AFDConfigError when its pattern is not a
        :attr:`pattern_type`). An override must be bounded by
        ``afd_process_group_timeout_s``, poll :attr:`is_closed` while waiting (raising
        AFDShutdown when it turns true), and release whatever it built before raising.
        """
        from afd_core.assembly import assemble

        recipe = self.recipe()
        if not isinstance(recipe.pattern, self.pattern_type):
            raise AFDConfigError(
                f"AFD: {type(self).__name__}.recipe() names the {type(recipe.pattern).__name__} "
                f"pattern, but its pattern_type is {self.pattern_type.__name__}; fix the "
                "connector so that both name the same pattern"
            )
        return assemble(self.runtime_spec(), recipe)

    def _tell_peer_lost(self, error: AFDPeerError) -> None:
        if self.on_peer_lost is not None:
            self.on_peer_lost(error)

    @property
    def is_initialized(self) -> bool:
        """True once :meth:`initialize` has completed (and :meth:`close` not yet run)."""
        return self._parts is not None and not self.fuse.closed

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self.fuse.closed

    def initialize(self) -> None:
        """Rendezvous with the peers and create the communication resources (idempotent)."""
        with self._lifecycle_lock:
            if self._parts is not None:
                return
            if self.fuse.closed:
                raise RuntimeError(f"{type(self).__name__} was closed; build a new connector")
            parts = self.connect()
            if self.fuse.closed:  # closed as connect() returned: take the parts down again
                _shut_down(parts)
                raise AFDShutdown(f"AFD: {self.name} was closed during initialize()")
            self._parts = parts

    def close(self) -> None:
        """Release every resource and wake blocked callers (idempotent, safe any time).

        The fuse is set before the lifecycle lock is taken, so a thread blocked in a
        data-plane wait returns with AFDShutdown and :meth:`connect` stops waiting.
        """
        self.fuse.close()
        with self._lifecycle_lock:
            parts, self._parts = self._parts, None
            if parts is not None:
                _shut_down(parts)

    @property
    def attention(self) -> AttentionEndpoint:
        """The attention endpoint (attention role, after :meth:`initialize`)."""
        return self._endpoint("attention", AttentionEndpoint)  # type: ignore[return-value]

    @property
    def ffn(self) -> FFNEndpoint:
        """The FFN endpoint (FFN role, after :meth:`initialize`) of a connector that
        announces steps (see :attr:`serves_work_items`)."""
        return self._endpoint("ffn", FFNEndpoint)  # type: ignore[return-value]

    @property
    def ffn_work(self) -> FFNWorkEndpoint:
        """The FFN endpoint (FFN role, after :meth:`initialize`) of an in-band connector."""
        return self._endpoint("ffn", FFNWorkEndpoint)  # type: ignore[return-value]

    @property
    def serves_work_items(self) -> bool:
        """True when the FFN endpoint gives work items (:class:`FFNWorkEndpoint`), not
        steps; after :meth:`initialize`."""
        return isinstance(self._endpoint("ffn", object), FFNWorkEndpoint)

    def endpoint_stats(self) -> dict[str, Any]:
        """The role endpoint's counters ({} before :meth:`initialize` and after close)."""
        parts = self._parts
        return {} if parts is None else parts.endpoint.stats()

    def _endpoint(self, role: str, kind: type) -> AttentionEndpoint | FFNEndpoint | FFNWorkEndpoint:
        if self.config.role != role:
            raise RuntimeError(f"{self.name}: the {role} endpoint is for the {role} role")
        parts = self._parts
        if parts is None:
            self.fuse.check()
            raise RuntimeError(f"{self.name}: call initialize() before exchanging data")
        if not isinstance(parts.endpoint, kind):
            raise RuntimeError(
                f"{self.name}: its {role} endpoint is a {type(parts.endpoint).__name__}, "
                f"not a {kind.__name__}"
            )
        return parts.endpoint


def _shut_down(parts: ConnectorParts) -> None:
    for step in parts.shutdown:
        step()
