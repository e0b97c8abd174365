"""``ExpertAttentionEndpoint``: the attention side of the expert-routed M:N exchange.

Per step the attention rank announces the step to FFN rank 0 (:mod:`afd_core.runtime.control.relay`
forwards it to the other FFN ranks). Per MoE layer and stage it gets the hidden states and
the routing its router chose (:class:`~afd_core.connector.ExpertRouting`: global top-k ids
and weights) and, for every FFN rank, sends

* a header whose ``num_tokens`` is the number of rows routed there (possibly 0) and
  whose ``topk`` is the routing width, and
* a body: those rows' hidden states, their top-k expert ids (int32) and weights
  (float32), packed in that order (:mod:`afd_core.runtime.expert.messages`).

On a transport that accepts a message shorter than its receive (gloo) header and body
travel as one frame (the FFN rank posts one receive with room for every token of the
stage); otherwise (NCCL) in the header-then-tensors form
(:func:`~afd_core.runtime.messages.forms.headed`: the header, then the body when it has
rows), and the FFN rank reads the header before it receives the body.

Every FFN rank answers with one frame, a header and the partial result of its experts
for those rows (:mod:`afd_core.runtime.messages.frames`: the attention rank knows its
size, since it routed the rows); :func:`~afd_core.runtime.expert.routing.combine` adds
the partial results up per token. Routed row counts vary per (attention rank, FFN rank,
layer) and travel in the headers, which :class:`~afd_core.wire.headers.HeaderWriter`
writes and checks. The rule "every layer, every stage, once" is the endpoint's
(:class:`~afd_core.kit.step_exchanges.StepExchanges`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from afd_core.connector import AttentionEndpoint, ExpertRouting
from afd_core.dataplane.transport import Transfer, TransferFailed
from afd_core.errors import AFDProtocolError
from afd_core.failures import guarded, layer_of_step
from afd_core.kit.endpoint_context import EndpointContext
from afd_core.kit.in_flight import InFlight
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.placement import ExpertPlacement
from afd_core.runtime.control.channel import ControlSender
from afd_core.runtime.expert.messages import body_bytes, pack_body
from afd_core.runtime.expert.routing import combine, rows_per_rank
from afd_core.runtime.messages.forms import headed
from afd_core.runtime.messages.frames import FrameLayout, frame_rows
from afd_core.wire import HEADER_BYTES, headers
from afd_core.wire.metadata import ControlPayload

if TYPE_CHECKING:
    import torch

    from afd_core.dataplane.transport import Transport
    from afd_core.failures import PeerFailures


@dataclass(frozen=True)
class FFNPeer:
    """How the attention rank reaches one FFN rank: the data ``transport`` and the FFN
    rank's number ``peer`` on it (one world shared by every rank, or a link of its own),
    and how to name it in errors."""

    transport: Transport
    peer: int
    failures: PeerFailures

    @property
    def name(self) -> str:
        """``"FFN rank 1 (world rank 1)"``."""
        return self.failures.describe(self.peer)


@dataclass(slots=True)
class _Step:
    step_id: int
    tokens: tuple[int, ...]


@dataclass(slots=True)
class _Route:
    """What went to one FFN rank for one layer and stage, and the frame its answer lands in."""

    ffn: FFNPeer
    rows: torch.Tensor
    count: int
    reply: torch.Tensor
    reply_layout: FrameLayout
    transfers: list[Transfer]


@dataclass(slots=True)
class _InFlight:
    tokens: int
    routes: list[_Route]
    home: torch.device


@dataclass
class DispatchCounts:
    """Rows this attention rank sent per (FFN rank, layer) since it started (for stats)."""

    rows: dict[int, dict[int, int]] = field(default_factory=dict)

    def add(self, ffn_rank: int, layer: int, rows: int) -> None:
        """Count ``rows`` sent to ``ffn_rank`` at ``layer``."""
        per_layer = self.rows.setdefault(ffn_rank, {})
        per_layer[layer] = per_layer.get(layer, 0) + rows


class ExpertAttentionEndpoint(AttentionEndpoint):
    """The attention side of the expert-routed exchange (see the module docstring).

    ``ffn_peers[f]`` reaches FFN rank ``f``.
    """

    def __init__(
        self,
        context: EndpointContext,
        *,
        placement: ExpertPlacement,
        ffn_peers: tuple[FFNPeer, ...],
        control: ControlSender,
        partials: str | None = None,
    ) -> None:
        import torch

        wire, transport = context.wire, context.transport
        self._torch = torch
        self._wire, self._role_rank, self._transport = wire, context.role_rank, transport
        self._fuse, self._failures, self._timeout_s = (
            context.fuse, context.failures, context.timeout_s
        )  # fmt: skip
        self._placement = placement
        self._ffn_peers = ffn_peers
        self._control = control
        self._dtype = getattr(torch, wire.dtype)
        #: The wire dtype of the FFN ranks' partial results (afd_core.config.partials).
        self._partials = partials or wire.dtype
        self._layers = wire.exchange_layers
        self._exchanges = StepExchanges(self._layers, f"attention rank {self._role_rank}")
        self._header_writer = headers.HeaderWriter(wire)
        self._owners = torch.tensor(placement.owners(), dtype=torch.int64, device=transport.device)
        self._step: _Step | None = None
        self._inflight: InFlight[_InFlight] = InFlight("AFD", self._role_rank)
        self._buffers = headers.HeaderedBuffers(transport)
        self.dispatched = DispatchCounts()

    @guarded
    def begin_step(self, payload: ControlPayload) -> None:
        self._fuse.check_departure()
        if payload.is_graph_step:
            raise AFDProtocolError(
                f"AFD: step {payload.step_id} is a CUDA graph step; the expert-routed "
                "connector runs eagerly: start the attention role with --enforce-eager"
            )
        tokens = self._exchanges.begin_announced(payload, self._role_rank)
        self._control.send(payload)
        self._step = _Step(payload.step_id, tokens)

    @guarded
    def send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        *,
        router_logits: torch.Tensor | None = None,
        routing: ExpertRouting | None = None,
    ) -> None:
        step = self._check_send(layer, stage, hidden, routing)
        assert routing is not None
        torch, transport = self._torch, self._transport
        device, home = transport.device, hidden.device
        hidden = hidden.to(device)
        ids = routing.topk_ids.to(device=device, dtype=torch.int32)
        weights = routing.topk_weights.to(device=device, dtype=torch.float32)
        routes = []
        for f, rows in enumerate(rows_per_rank(ids, self._owners, len(self._ffn_peers))):
            ffn, count = self._ffn_peers[f], rows.numel()
            self.dispatched.add(f, layer, count)
            layout = FrameLayout.of(self._wire, count, self._partials)
            reply = torch.empty(layout.size, dtype=torch.uint8, device=device)
            sends = self._messages(step.step_id, layer, stage, f, hidden, ids, weights, rows)
            try:
                transfers = [ffn.transport.post_send(t, ffn.peer) for t in sends]
                transfers.append(ffn.transport.post_recv(reply, ffn.peer))
            except TransferFailed as exc:
                raise ffn.failures.error(exc, layer_of_step(layer, step.step_id)) from None
            routes.append(_Route(ffn, rows, count, reply, layout, transfers))
        self._inflight.put(layer, stage, _InFlight(hidden.shape[0], routes, home))

    @guarded
    def recv(self, layer: int, stage: int) -> torch.Tensor:
        step = self._step
        inflight = self._inflight.take(layer, stage)
        assert step is not None  # a send of this step put it in flight
        transport = self._transport
        deadline = time.monotonic() + self._timeout_s
        for route in inflight.routes:
            try:
                route.ffn.transport.wait_all(route.transfers, deadline)
            except TransferFailed as exc:
                doing = layer_of_step(layer, step.step_id)
                raise route.ffn.failures.error(exc, doing) from None
        for ffn in {id(r.ffn.transport): r.ffn for r in inflight.routes}.values():
            try:
                ffn.transport.synchronize(deadline)
            except TransferFailed as exc:
                doing = layer_of_step(layer, step.step_id)
                raise ffn.failures.error(exc, doing) from None
        parts = []
        for f, route in enumerate(inflight.routes):
            raw = headers.read_header(route.ffn.transport, route.reply)
            expected = headers.MessageHeader("f2a", step.step_id, layer, stage, route.count, f)
            self._header_writer.expect(raw, route.ffn.name, expected)
            if route.count:
                partial = frame_rows(route.reply, route.reply_layout, self._wire.hidden_size,
                                     getattr(self._torch, self._partials))  # fmt: skip
                parts.append((route.rows, partial))
        self._exchanges.finish()
        out = combine(inflight.tokens, parts, self._wire.hidden_size, self._dtype, transport.device)
        return out if out.device == inflight.home else out.to(inflight.home)

    def stats(self) -> dict[str, Any]:
        """``{"dispatched_rows": {ffn_rank: {layer: rows}}}`` since this rank started."""
        return {"dispatched_rows": self.dispatched.rows}

    def _check_send(
        self, layer: int, stage: int, hidden: torch.Tensor, routing: ExpertRouting | None
    ) -> _Step:
        self._inflight.check_free(layer, stage)
        self._exchanges.take(layer, stage)
        step = self._step
        assert step is not None  # take() raises before the first step
        n, size = step.tokens[stage], self._wire.hidden_size
        if hidden.shape != (n, size) or hidden.dtype != self._dtype:
            raise AFDProtocolError(
                f"AFD: hidden is {tuple(hidden.shape)} {hidden.dtype}, the step and wire spec "
                f"say ({n}, {size}) {self._dtype}"
            )
        if routing is None:
            raise AFDProtocolError(
                "AFD: the expert-routed connector needs the routing of every MoE layer "
                "(top-k expert ids and weights from the attention role's router); it runs "
                "with compute_gate_on_attention=true"
            )
        k = self._wire.top_k
        ids, weights = routing.topk_ids, routing.topk_weights
        if ids.shape != (n, k) or weights.shape != (n, k):
            raise AFDProtocolError(
                f"AFD: routing is {tuple(ids.shape)} ids and {tuple(weights.shape)} weights; "
                f"the step and wire spec say ({n}, {k})"
            )
        return step

    def _messages(
        self,
        step_id: int,
        layer: int,
        stage: int,
        ffn_rank: int,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        weights: torch.Tensor,
        rows: torch.Tensor,
    ) -> list[torch.Tensor]:
        """The messages to send one FFN rank: a frame ``[header + body]``, or where message
        sizes must match exactly the header-then-tensors form ``[header, body]`` (no body
        without rows)."""
        count = rows.numel()
        nbytes = body_bytes(count, self._wire)
        buffer = self._buffers.get((stage, ffn_rank), HEADER_BYTES + nbytes)
        message = buffer.tensor
        if count:
            pack_body(message[HEADER_BYTES : HEADER_BYTES + nbytes], hidden, ids, weights, rows,
                      self._wire)  # fmt: skip
        header = headers.MessageHeader("a2f", step_id, layer, stage, count, self._role_rank,
                               topk=self._wire.top_k)  # fmt: skip
        self._header_writer.write(buffer.header, 0, header)
        buffer.publish_header()
        if self._transport.accepts_short_messages:
            return [message[: HEADER_BYTES + nbytes]]
        return headed(message[:HEADER_BYTES], (message[HEADER_BYTES : HEADER_BYTES + nbytes],))
