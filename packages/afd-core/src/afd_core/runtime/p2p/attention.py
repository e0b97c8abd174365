"""``P2pAttentionEndpoint``: the attention side of the P2P exchange, over any transport.

An attention rank talks to the one FFN rank serving its block (:mod:`afd_core.topology`).
Per step it announces the step on the control channel; per layer and stage it sends the
hidden states (and the router logits, when the layer carries them) and receives the FFN
result (docs/wire-protocol.md):

* messages up to 1 MiB on a host-memory transport (gloo) as one frame each way
  (:mod:`afd_core.runtime.p2p.frames`): the header and the tensors are copied into the stage's
  send frame, and the reply lands in a frame whose rows become the caller's output (a
  new tensor per layer, no copy);
* otherwise (larger messages, device transports such as NCCL) as a header message
  followed by the bare tensors, sent from the caller's tensors and received straight
  into a new output tensor (no copy).

Posting order: on a transport whose pair operations run in posting order (NCCL) the
sends go first, since a receive posted first would block the send the FFN rank waits
for; elsewhere (gloo) the receives go first, so the FFN rank's reply never waits for a
receive to be posted. CUDA graph steps send and receive the same tensors without header
messages; their checks happen on the control plane.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.connector import AttentionEndpoint, ExpertRouting
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.failures import guarded, layer_of_step
from afd_core.metadata import ControlPayload
from afd_core.replay_guard import ReplayGuard
from afd_core.runtime.control.channel import ControlSender
from afd_core.runtime.endpoint_context import EndpointContext, active_step, take_in_flight
from afd_core.runtime.p2p.frames import (
    FrameBuffer,
    FrameLayout,
    HeldFrame,
    ReplyFrames,
    memmove,
    uses_frames,
)
from afd_core.runtime.p2p.headers import IncomingHeaders, OutgoingHeaders
from afd_core.transport import Transfer, TransferFailed
from afd_core.wire import HEADER_BYTES, HeaderCodec

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch


@dataclass(slots=True)
class _Step:
    """The step in progress: its id, token count per stage, kind, and exchanges done."""

    step_id: int
    tokens: tuple[int, ...]
    graph: bool
    expected: int
    done: int = 0


@dataclass(slots=True)
class _InFlight:
    """One stage's exchange between ``send`` and ``recv``: ``home`` is the caller's device
    when the output must go back there (None: hand it out as it is); ``reply_frame`` the
    host address of the reply's frame (0: the reply has no frame)."""

    layer: int
    row: int
    transfers: list[Transfer]
    out: torch.Tensor
    home: torch.device | None
    reply_frame: int = 0


@dataclass(slots=True)
class _StageFrames:
    """One stage's frames in a step (host transports): what it sends, where replies land."""

    send: HeldFrame
    replies: ReplyFrames


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
        # Every message of this rank goes to its one FFN rank: posts and waits go through a
        # lane to it, with the peer and the wait limit worked out once.
        self._lane = context.transport.lane(peer.transport_rank, context.timeout_s)
        self._control = control
        self._replays = replays
        self._empty = torch.empty
        self._dtype = getattr(torch, wire.dtype)
        self._logits_dtype = getattr(torch, wire.router_logits_dtype)
        self._layers = wire.exchange_layers
        self._index = {layer: i for i, layer in enumerate(self._layers)}
        self._logits_widths = {layer: wire.logits_width_at(layer) for layer in self._layers}
        self._codec = HeaderCodec(wire)
        self._step: _Step | None = None
        self._inflight: dict[int, _InFlight] = {}
        self._outgoing: OutgoingHeaders | None = None
        self._incoming: IncomingHeaders | None = None
        self._sender_name = context.failures.describe(peer.transport_rank)
        # Messages up to 1 MiB on host transports are frames: a send buffer per stage that used
        # frames, and each stage's frames in the step (None: its messages are not frames).
        self._send_buffers: dict[int, FrameBuffer] = {}
        self._frames: list[_StageFrames | None] = []

    @guarded
    def begin_step(self, payload: ControlPayload) -> None:
        self._fuse.check_departure()
        if payload.sender_rank != self._role_rank:
            raise AFDProtocolError(
                f"AFD control: attention rank {self._role_rank} was asked to send a payload "
                f"signed by attention rank {payload.sender_rank}"
            )
        step = self._step
        if step is not None and step.done != step.expected:
            raise AFDProtocolError(
                f"AFD: attention rank {self._role_rank} starts step {payload.step_id} after "
                f"{step.done} layer exchanges in step {step.step_id}, expected "
                f"{step.expected} ({len(self._layers)} layers x {len(step.tokens)} stages, "
                "none for a graph replay); every forward must exchange at every layer and stage"
            )
        if payload.is_graph_step and self._replays is None:
            raise AFDProtocolError(
                f"AFD: step {payload.step_id} is a CUDA graph step, but this connector has no "
                "graph steps; run the attention role with --enforce-eager"
            )
        if not payload.is_graph_step and self._replays is not None:
            self._replays.drain(f"eager step {payload.step_id}")
        tokens = payload.tokens_of(self._role_rank)
        self._control.send(payload)
        replay = payload.is_graph_step and not payload.is_graph_capturing
        self._step = _Step(
            step_id=payload.step_id,
            tokens=tokens,
            graph=payload.is_graph_step,
            expected=0 if replay else len(tokens) * len(self._layers),
        )
        if not payload.is_graph_step:
            self._write_headers(payload.step_id, tokens)

    def _write_headers(self, step_id: int, tokens: tuple[int, ...]) -> None:
        """Every header of the step: what this rank sends and what it expects back."""
        rows = len(tokens) * len(self._layers)
        if self._outgoing is None or self._outgoing.rows < rows:
            self._outgoing = OutgoingHeaders(self._transport, rows)
            self._incoming = IncomingHeaders(self._transport, rows, self._sender_name)
        assert self._incoming is not None
        codec, out_view, in_view = self._codec, self._outgoing.view, self._incoming.view
        for stage, n in enumerate(tokens):
            for i, layer in enumerate(self._layers):
                offset = (stage * len(self._layers) + i) * 64
                width = self._wire.logits_width_at(layer)
                codec.pack_into(
                    out_view, offset, "a2f", step_id, layer, stage, n, self._role_rank,
                    logits_width=width,
                )  # fmt: skip
                codec.pack_into(
                    in_view, offset, "f2a", step_id, layer, stage, n, self._peer.ffn_rank
                )
        self._outgoing.publish()
        self._incoming.publish()
        self._lay_out_frames(tokens)

    def _lay_out_frames(self, tokens: tuple[int, ...]) -> None:
        """Each stage's send frame and reply frames in the step, for stages whose messages
        are frames."""
        wire, previous = self._wire, self._frames
        self._frames = []
        for stage, n in enumerate(tokens):
            layout = FrameLayout.of(wire, n)
            if not uses_frames(self._transport, layout):
                self._frames.append(None)
                continue
            buffer = self._send_buffers.get(stage)
            if buffer is None:
                buffer = self._send_buffers[stage] = FrameBuffer()
            kept = previous[stage] if stage < len(previous) else None
            if kept is not None and kept.replies.layout == layout:
                replies = kept.replies  # with the frame it prepared for this layer
            else:
                replies = ReplyFrames(layout, wire.hidden_size, self._dtype)
            replies.prepare()
            self._frames.append(_StageFrames(buffer.hold(layout), replies))

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
        step, index = self._step, self._index.get(layer)
        width = self._logits_widths.get(layer, 0)
        if (
            step is None
            or index is None
            or routing is not None
            or stage in self._inflight
            or not 0 <= stage < len(step.tokens)
            or step.done >= step.expected
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
        assert step is not None and index is not None
        row = stage * len(self._layers) + index
        try:
            if step.graph:
                inflight = self._post_bare(layer, row, hidden, router_logits)
            elif self._frames[stage] is not None:
                inflight = self._post_frame(layer, stage, row, hidden, router_logits)
            else:
                inflight = self._post_headed(layer, row, hidden, router_logits)
        except TransferFailed as exc:
            raise self._failures.error(exc, layer_of_step(layer, step.step_id)) from None
        self._inflight[stage] = inflight

    def _post_frame(
        self,
        layer: int,
        stage: int,
        row: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
    ) -> _InFlight:
        """Messages up to 1 MiB on host transports: one frame each way (see :mod:`.frames`)."""
        frames = self._frames[stage]
        assert self._outgoing is not None and frames is not None
        frame = frames.send
        memmove(frame.address, self._outgoing.address(row), HEADER_BYTES)
        frame.write_hidden(hidden)
        message = frame.message
        if router_logits is not None:
            frame.write_logits(router_logits)
            message = frame.message_with_logits
        reply, reply_frame, out = frames.replies.take()
        lane = self._lane
        if self._transport.ordered_pairs:
            transfers = [lane.post_send(message), lane.post_recv(reply)]
        else:
            transfers = [lane.post_recv(reply), lane.post_send(message)]
        frames.replies.prepare()  # the next layer's, while this round trip is in flight
        home = None if hidden.is_cpu else hidden.device
        return _InFlight(layer, row, transfers, out, home, reply_frame)

    def _post_headed(
        self, layer: int, row: int, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> _InFlight:
        """A header message, then the bare tensors, each way."""
        outgoing, incoming = self._outgoing, self._incoming
        assert outgoing is not None and incoming is not None
        lane = self._lane
        hidden, logits, out, home = self._on_device(hidden, router_logits)
        n = hidden.shape[0]
        if self._transport.ordered_pairs:
            transfers = [lane.post_send(outgoing.row(row))]
            if n:
                transfers.append(lane.post_send(hidden))
                if logits is not None:
                    transfers.append(lane.post_send(logits))
            transfers.append(lane.post_recv(incoming.row(row)))
            if n:
                transfers.append(lane.post_recv(out))
        else:
            transfers = [lane.post_recv(incoming.row(row))]
            if n:
                transfers.append(lane.post_recv(out))
            transfers.append(lane.post_send(outgoing.row(row)))
            if n:
                transfers.append(lane.post_send(hidden))
                if logits is not None:
                    transfers.append(lane.post_send(logits))
        return _InFlight(layer, row, transfers, out, home)

    def _post_bare(
        self, layer: int, row: int, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> _InFlight:
        """Graph steps: the bare tensors each way, no header (checked on the control plane)."""
        lane = self._lane
        hidden, logits, out, home = self._on_device(hidden, router_logits)
        if self._transport.ordered_pairs:
            transfers = [lane.post_send(hidden)]
            if logits is not None:
                transfers.append(lane.post_send(logits))
            transfers.append(lane.post_recv(out))
        else:
            transfers = [lane.post_recv(out), lane.post_send(hidden)]
            if logits is not None:
                transfers.append(lane.post_send(logits))
        return _InFlight(layer, row, transfers, out, home)

    def _on_device(
        self, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.device | None]:
        """``hidden`` and the logits on the transport's device, a new output tensor there,
        and the caller's device when it is another (where :meth:`recv` hands it back)."""
        device = self._transport.device
        home = hidden.device
        if home == device:
            home = None
        else:
            hidden = hidden.to(device)
        out = self._empty(hidden.shape, dtype=self._dtype, device=device)
        logits = None if router_logits is None else router_logits.to(device).contiguous()
        return hidden, logits, out, home

    def _reject_send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
        routing: ExpertRouting | None,
    ) -> None:
        """Raise AFDProtocolError explaining why :meth:`send` cannot send this."""
        step = self._active_step(layer, stage)
        if routing is not None:
            raise AFDProtocolError(
                "AFD: a P2P connector sends router logits, not expert routing; use an "
                "expert-routed connector (DeepEPM2NAFDConnector) to route tokens to experts"
            )
        if stage in self._inflight:
            raise AFDProtocolError(
                f"AFD: attention rank {self._role_rank} sends layer {layer} stage {stage} while "
                "the previous exchange of that stage awaits recv()"
            )
        n = step.tokens[stage]
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
        inflight = take_in_flight(self._inflight, layer, stage, self._role_rank)
        assert step is not None  # a send of this step put it in flight
        try:
            self._lane.wait_all(inflight.transfers)
            step.done += 1
            incoming = self._incoming
            if not step.graph and incoming is not None:
                if inflight.reply_frame:
                    incoming.check_frame(inflight.row, inflight.reply_frame)
                elif incoming.checks_each_message:
                    incoming.check(inflight.row)
                elif step.done == step.expected:
                    self._transport.synchronize(time.monotonic() + self._timeout_s)
                    incoming.check_all(step.expected)
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

    def _active_step(self, layer: int, stage: int) -> _Step:
        step = active_step(self._step, layer, stage, self._layers, self._role_rank)
        if step.done >= step.expected:
            raise AFDProtocolError(
                f"AFD: attention rank {self._role_rank} exchanges layer {layer} after step "
                f"{step.step_id} made all its {step.expected} exchanges; begin the next step first"
            )
        return step

    @staticmethod
    def _check_rows(
        name: str, tensor: torch.Tensor, rows: int, cols: int, dtype: torch.dtype
    ) -> None:
        if tensor.shape != (rows, cols) or tensor.dtype != dtype or not tensor.is_contiguous():
            raise AFDProtocolError(
                f"AFD: {name} is {tuple(tensor.shape)} {tensor.dtype}, the step and wire spec "
                f"say a contiguous ({rows}, {cols}) {dtype}"
            )
