"""``P2pAttentionEndpoint``: the attention side of the P2P exchange, over any transport.

An attention rank talks to the one FFN rank serving its block (:mod:`afd_core.topology`).
Per step it announces the step on the control channel; per layer and stage it sends the
hidden states (and the router logits, when the layer carries them) and receives the FFN
result (docs/wire-protocol.md), in one of the message forms of
:mod:`afd_core.runtime.messages`, chosen per stage when the step begins:

* :class:`_FrameForm`: messages up to 1 MiB on a host-memory transport (gloo) are one
  frame each way: the header and the tensors are copied into the stage's send frame,
  and the reply lands in a frame whose rows become the caller's output (a new tensor per
  layer, no copy);
* :class:`_HeadedForm`: otherwise (larger messages, device transports such as NCCL) a
  header message followed by the bare tensors, sent from the caller's tensors and
  received straight into a new output tensor (no copy);
* :class:`_BareForm`: CUDA graph steps send and receive the same tensors without
  headers; their checks happen on the control plane.

Every form posts through the transport's :func:`~afd_core.runtime.messages.forms.posting_order`.
The rule "every layer, every stage, once" is the endpoint's
(:class:`~afd_core.kit.step_exchanges.StepExchanges`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.connector import AttentionEndpoint, ExpertRouting
from afd_core.dataplane.replay_guard import ReplayGuard
from afd_core.dataplane.transport import PeerTransport, Transfer, TransferFailed
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.failures import guarded, layer_of_step
from afd_core.kit.endpoint_context import EndpointContext
from afd_core.kit.in_flight import InFlight
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.runtime.control.channel import ControlSender
from afd_core.runtime.messages.forms import PostingOrder, headed, posting_order
from afd_core.runtime.messages.frames import (
    FrameBuffer,
    FrameLayout,
    HeldFrame,
    ReplyFrames,
    memmove,
    uses_frames,
)
from afd_core.wire import HEADER_BYTES
from afd_core.wire.headers import HeaderWriter, IncomingHeaders, OutgoingHeaders
from afd_core.wire.metadata import ControlPayload

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch

    from afd_core.dataplane.transport import Transport


@dataclass(slots=True)
class _Step:
    """The step in progress: its id, token count per stage and kind."""

    step_id: int
    tokens: tuple[int, ...]
    graph: bool


@dataclass(slots=True)
class _InFlight:
    """One stage's exchange between ``send`` and ``recv``: the ``form`` that posted it,
    ``home`` the caller's device when the output must go back there (None: hand it out as
    it is); ``reply_at`` the host address of the reply's frame (0: the reply is no frame)."""

    row: int
    form: _Form
    transfers: list[Transfer]
    out: torch.Tensor
    home: torch.device | None
    reply_at: int = 0


class _Posting:
    """What every form of one endpoint posts with: the peer transport to its FFN rank, the
    transport's posting order, and output tensors on the transport's device."""

    def __init__(self, transport: Transport, to_peer: PeerTransport, dtype: torch.dtype) -> None:
        import torch

        self.transport, self.to_peer, self.dtype = transport, to_peer, dtype
        self.order: PostingOrder = posting_order(transport)
        self._empty = torch.empty

    def post(self, sends: list[torch.Tensor], receives: list[torch.Tensor]) -> list[Transfer]:
        """Post one exchange's sends and receives in the transport's order."""
        return self.order.post(self.to_peer, sends, receives)

    def on_device(
        self, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.device | None]:
        """``hidden`` and the logits on the transport's device, a new output tensor there,
        and the caller's device when it is another (where ``recv`` hands it back)."""
        device = self.transport.device
        home = hidden.device
        if home == device:
            home = None
        else:
            hidden = hidden.to(device)
        out = self._empty(hidden.shape, dtype=self.dtype, device=device)
        logits = None if router_logits is None else router_logits.to(device).contiguous()
        return hidden, logits, out, home


class _FrameForm:
    """One stage's messages as frames (see the module docstring)."""

    def __init__(
        self, posting: _Posting, send: HeldFrame, replies: ReplyFrames, headers: _StepHeaders
    ) -> None:
        self.replies = replies
        self._posting, self._send, self._headers = posting, send, headers

    def post(self, row: int, hidden: torch.Tensor, router_logits: torch.Tensor | None) -> _InFlight:
        """Copy the header and tensors into the send frame; post it and the reply's."""
        frame = self._send
        memmove(frame.address, self._headers.outgoing.address(row), HEADER_BYTES)
        frame.write_hidden(hidden)
        message = frame.message
        if router_logits is not None:
            frame.write_logits(router_logits)
            message = frame.message_with_logits
        reply, reply_at, out = self.replies.take()
        transfers = self._posting.post([message], [reply])
        self.replies.prepare()  # the next layer's, while this round trip is in flight
        home = None if hidden.is_cpu else hidden.device
        return _InFlight(row, self, transfers, out, home, reply_at)

    def received(self, inflight: _InFlight, step_rows: int) -> None:
        """Check the reply frame's header."""
        self._headers.incoming.check_at(inflight.row, inflight.reply_at)


class _HeadedForm:
    """One stage's messages as a header message, then the bare tensors."""

    def __init__(self, posting: _Posting, headers: _StepHeaders, timeout_s: float) -> None:
        self._posting, self._headers, self._timeout_s = posting, headers, timeout_s

    def post(self, row: int, hidden: torch.Tensor, router_logits: torch.Tensor | None) -> _InFlight:
        """Post the header and tensors, and the receives of the reply's."""
        posting, headers = self._posting, self._headers
        hidden, logits, out, home = posting.on_device(hidden, router_logits)
        sends = headed(headers.outgoing.row(row), (hidden, logits))
        transfers = posting.post(sends, headed(headers.incoming.row(row), (out,)))
        return _InFlight(row, self, transfers, out, home)

    def received(self, inflight: _InFlight, step_rows: int) -> None:
        """Check the reply's header: at once on a host transport; on a device transport
        every header of the step at once, after its last exchange (``step_rows`` > 0)."""
        incoming = self._headers.incoming
        if incoming.checks_each_message:
            incoming.check(inflight.row)
        elif step_rows:
            self._posting.transport.synchronize(time.monotonic() + self._timeout_s)
            incoming.check_all(step_rows)


class _BareForm:
    """Graph steps: the bare tensors each way, no header (checked on the control plane)."""

    def __init__(self, posting: _Posting) -> None:
        self._posting = posting

    def post(self, row: int, hidden: torch.Tensor, router_logits: torch.Tensor | None) -> _InFlight:
        """Post the tensors and the receive of the result."""
        hidden, logits, out, home = self._posting.on_device(hidden, router_logits)
        sends = [hidden] if logits is None else [hidden, logits]
        return _InFlight(row, self, self._posting.post(sends, [out]), out, home)

    def received(self, inflight: _InFlight, step_rows: int) -> None:
        """Nothing to check per message."""


_Form = _FrameForm | _HeadedForm | _BareForm


@dataclass(slots=True)
class _StepHeaders:
    """The header rows of a step with the FFN rank: sent, and expected back."""

    outgoing: OutgoingHeaders
    incoming: IncomingHeaders


@dataclass(frozen=True)
class P2pPeer:
    """The FFN rank an attention rank exchanges with: its role rank, and its rank on the
    transports (its world rank in a world of every rank, 0 on a link of their own)."""

    ffn_rank: int
    transport_rank: int


class P2pAttentionEndpoint(AttentionEndpoint):
    """The attention side of P2P (see the module docstring).

    ``control`` sends the step announcements; ``replays`` bounds CUDA graph replays
    (None: the connector has no graph steps).
    """

    def __init__(
        self,
        context: EndpointContext,
        *,
        peer: P2pPeer,
        control: ControlSender,
        replays: ReplayGuard | None = None,
    ) -> None:
        import torch

        wire = context.wire
        self._wire, self._role_rank, self._transport = wire, context.role_rank, context.transport
        self._fuse, self._failures, self._timeout_s = (
            context.fuse, context.failures, context.timeout_s
        )  # fmt: skip
        self._peer = peer
        self._control = control
        self._replays = replays
        self._dtype = getattr(torch, wire.dtype)
        self._logits_dtype = getattr(torch, wire.router_logits_dtype)
        self._layers = wire.exchange_layers
        self._logits_widths = {layer: wire.logits_width_at(layer) for layer in self._layers}
        self._exchanges = StepExchanges(self._layers, f"attention rank {self._role_rank}")
        self._header_writer = HeaderWriter(wire)
        self._step: _Step | None = None
        self._inflight: InFlight[_InFlight] = InFlight("AFD", self._role_rank)
        self._headers: _StepHeaders | None = None
        self._sender_name = context.failures.describe(peer.transport_rank)
        # Every message of this rank goes to its one FFN rank: posts and waits go through a
        # peer transport to it, with the peer and the wait limit worked out once.
        self._to_peer = context.transport.to_peer(peer.transport_rank, context.timeout_s)
        self._posting = _Posting(context.transport, self._to_peer, self._dtype)
        self._bare = _BareForm(self._posting)
        # Each stage's form in the step in progress, and a send buffer per stage that sent
        # frames (reused from step to step).
        self._forms: list[_Form] = []
        self._send_buffers: dict[int, FrameBuffer] = {}

    @guarded
    def begin_step(self, payload: ControlPayload) -> None:
        self._fuse.check_departure()
        if payload.is_graph_step and self._replays is None:
            raise AFDProtocolError(
                f"AFD: step {payload.step_id} is a CUDA graph step, but this connector has no "
                "graph steps; run the attention role with --enforce-eager"
            )
        replay = payload.is_graph_step and not payload.is_graph_capturing
        tokens = self._exchanges.begin_announced(payload, self._role_rank, exchanges=not replay)
        if not payload.is_graph_step and self._replays is not None:
            self._replays.drain(f"eager step {payload.step_id}")
        self._control.send(payload)
        self._step = _Step(payload.step_id, tokens, payload.is_graph_step)
        if payload.is_graph_step:
            self._forms = [self._bare] * len(tokens)
        else:
            self._choose_forms(payload.step_id, tokens)

    def _choose_forms(self, step_id: int, tokens: tuple[int, ...]) -> None:
        """Write every header of the step (what this rank sends and what it expects back)
        and choose each stage's form: frames where its messages fit, else headed."""
        rows = len(tokens) * len(self._layers)
        headers = self._headers
        if headers is None or headers.outgoing.rows < rows:
            headers = self._headers = _StepHeaders(
                OutgoingHeaders(self._transport, rows),
                IncomingHeaders(self._transport, rows, self._sender_name),
            )
        for stage, n in enumerate(tokens):
            self._header_writer.write_stage(headers.outgoing.view, headers.incoming.view,
                                            step_id, stage, n, self._role_rank,
                                            self._peer.ffn_rank)  # fmt: skip
        headers.outgoing.publish()
        headers.incoming.publish()
        previous, self._forms = self._forms, []
        for stage, n in enumerate(tokens):
            layout = FrameLayout.of(self._wire, n)
            if not uses_frames(self._transport, layout):
                self._forms.append(_HeadedForm(self._posting, headers, self._timeout_s))
                continue
            buffer = self._send_buffers.get(stage)
            if buffer is None:
                buffer = self._send_buffers[stage] = FrameBuffer()
            kept = previous[stage] if stage < len(previous) else None
            if isinstance(kept, _FrameForm) and kept.replies.layout == layout:
                replies = kept.replies  # with the frame it prepared for this layer
            else:
                replies = ReplyFrames(layout, self._wire.hidden_size, self._dtype)
            replies.prepare()
            self._forms.append(_FrameForm(self._posting, buffer.hold(layout), replies, headers))

    def send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        *,
        router_logits: torch.Tensor | None = None,
        routing: ExpertRouting | None = None,
    ) -> None:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            self._send(layer, stage, hidden, router_logits, routing)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    def _send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
        routing: ExpertRouting | None,
    ) -> None:
        # The hot path: a few cheap checks; _reject_send explains whichever failed.
        step = self._step
        width = self._logits_widths.get(layer, 0)
        if (
            step is None
            or routing is not None
            or stage in self._inflight
            or not 0 <= stage < len(step.tokens)
            or hidden.dtype != self._dtype
            or hidden.shape != (step.tokens[stage], self._wire.hidden_size)
            or not hidden.is_contiguous()
            or (router_logits is None) != (width == 0)
            or (
                router_logits is not None
                and (
                    router_logits.shape != (step.tokens[stage], width)
                    or router_logits.dtype != self._logits_dtype
                )
            )
        ):
            self._reject_send(layer, stage, hidden, router_logits, routing)
        assert step is not None
        row = self._exchanges.take(layer, stage)
        try:
            self._inflight.put(layer, stage, self._forms[stage].post(row, hidden, router_logits))
        except TransferFailed as exc:
            raise self._failures.error(exc, layer_of_step(layer, step.step_id)) from None

    def _reject_send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
        routing: ExpertRouting | None,
    ) -> None:
        """Raise AFDProtocolError explaining why :meth:`send` cannot send this."""
        if routing is not None:
            raise AFDProtocolError(
                "AFD: a P2P connector sends router logits, not expert routing; use an "
                "expert-routed connector (ExpertRoutedAFDConnector) to route tokens to experts"
            )
        self._inflight.check_free(layer, stage)
        self._exchanges.take(layer, stage)  # raises for no step, another layer or stage
        assert self._step is not None
        n = self._step.tokens[stage]
        self._check_rows("hidden", hidden, n, self._wire.hidden_size, self._dtype)
        width = self._wire.logits_width_at(layer)
        if router_logits is not None and width:
            self._check_rows("router_logits", router_logits, n, width, self._logits_dtype)
        raise AFDProtocolError(
            f"AFD: router_logits {'missing' if router_logits is None else 'given'} for "
            f"layer {layer}, whose wire spec has {width} router-logit columns; "
            "compute_gate_on_attention decides whether the attention role sends router "
            "logits, and dense layers never do"
        )

    def recv(self, layer: int, stage: int) -> torch.Tensor:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            return self._recv(layer, stage)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    def _recv(self, layer: int, stage: int) -> torch.Tensor:
        step = self._step
        inflight = self._inflight.take(layer, stage)
        assert step is not None  # a send of this step put it in flight
        exchanges = self._exchanges
        try:
            self._to_peer.wait_all(inflight.transfers)
            last = exchanges.finish()
            inflight.form.received(inflight, exchanges.expected if last else 0)
        except TransferFailed as exc:
            doing = layer_of_step(layer, step.step_id)
            raise self._failures.error(exc, doing, self._peer.transport_rank) from None
        out, home = inflight.out, inflight.home
        return out if home is None else out.to(home)

    def graph_capture(self) -> AbstractContextManager[None]:
        if self._replays is None:
            return super().graph_capture()
        return self._replays.capturing()

    @guarded
    def watch_graph_replay(self, step_id: int) -> None:
        if self._replays is None:
            super().watch_graph_replay(step_id)
            return
        self._replays.watch(step_id)

    @staticmethod
    def _check_rows(
        name: str, tensor: torch.Tensor, rows: int, cols: int, dtype: torch.dtype
    ) -> None:
        if tensor.shape != (rows, cols) or tensor.dtype != dtype or not tensor.is_contiguous():
            raise AFDProtocolError(
                f"AFD: {name} is {tuple(tensor.shape)} {tensor.dtype}, the step and wire spec "
                f"say a contiguous ({rows}, {cols}) {dtype}"
            )
