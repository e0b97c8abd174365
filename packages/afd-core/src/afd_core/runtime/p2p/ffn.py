"""``P2pFFNEndpoint``: the FFN side of the P2P exchange, over any transport.

An FFN rank serves a contiguous block of attention ranks (:mod:`afd_core.topology`). It
takes each step from its :class:`~afd_core.runtime.control.channel.ControlInbox`; per layer and
stage it receives every taking-part rank's message, computes once on all their rows and
sends each rank its rows of the output:

* on a host-memory transport (gloo) a message of up to 1 MiB is one frame
  (:mod:`afd_core.runtime.messages.frames`). With one rank in the step the batch's tensors are views
  of that rank's frame (no copy); with several, each frame's rows are copied into their
  place in the stage's input tensors. Each rank's output rows are copied into its reply
  frame behind the header;
* larger messages, and every message on a device transport (NCCL), are a header message
  and bare tensors (:func:`~afd_core.runtime.messages.forms.headed`), received straight
  into each rank's rows of the input tensors and sent from slices of the output tensor
  itself (no copy);
* CUDA graph steps (:meth:`P2pFFNEndpoint.recv_into`, :meth:`P2pFFNEndpoint.send_from`)
  move the bare tensors.

Per step the endpoint lays out a :class:`_StepPlan` once: each rank's rows, its headers
(written for the whole step, see :mod:`afd_core.wire.headers`), its frames and
the stage's input tensors; buffers are reused from step to step while the shapes fit.
The rule "every layer, every stage, once" is the endpoint's
(:class:`~afd_core.kit.step_exchanges.StepExchanges`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.connector import FFNEndpoint, FFNLayerBatch, FFNStep
from afd_core.dataplane.replay_guard import ReplayGuard
from afd_core.dataplane.transport import PeerTransport, Transfer, TransferFailed
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.failures import guarded, guarded_until_closed, layer_of_step
from afd_core.kit.endpoint_context import EndpointContext
from afd_core.kit.peer_links import loss_record
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.runtime.control.channel import ControlInbox
from afd_core.runtime.messages.forms import headed
from afd_core.runtime.messages.frames import (
    FrameBuffer,
    FrameLayout,
    HeldFrame,
    memmove,
    uses_frames,
)
from afd_core.wire import HEADER_BYTES
from afd_core.wire.headers import HeaderWriter, IncomingHeaders, OutgoingHeaders

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from afd_core.kit.peer_links import AttentionLink, FFNLinks


@dataclass(slots=True)
class _MemberFrames:
    """One attention rank's frames in a step (host transports): where its message lands
    (``received``) and where its reply is built (``reply``). ``copy_in``: its rows are
    copied from the frame to ``hidden_at``/``logits_at`` in the stage's input tensors
    (several ranks in the step); else the batch's tensors are views of the frame.
    ``output_at``: the byte offset of its rows in the output."""

    received: HeldFrame
    reply: HeldFrame
    copy_in: bool
    hidden_at: int
    logits_at: int
    output_at: int


@dataclass(slots=True)
class _Member:
    """One attention rank of a step: its link (and a peer transport to it on the link's data
    transport), where its rows go, its headers and frames."""

    rank: int
    link: AttentionLink
    to_peer: PeerTransport
    step_id: int
    rows: slice
    count: int
    incoming: IncomingHeaders
    outgoing: OutgoingHeaders
    hidden: torch.Tensor
    logits: torch.Tensor | None
    frames: _MemberFrames | None


@dataclass(slots=True)
class _StagePlan:
    """One stage of a step: its members, total rows and input tensors. ``solo`` is the
    one member when the batch is that member's frame (one attention rank, frames): its
    layers take a path without loops or closures. ``received``: the layer received last
    and its row in the step, until its result is sent."""

    members: tuple[_Member, ...]
    total: int
    hidden: torch.Tensor
    logits: torch.Tensor | None
    splits: tuple[int, ...]
    solo: _Member | None = None
    received: tuple[int, int] | None = None


@dataclass(slots=True)
class _StepPlan:
    step: FFNStep
    stages: tuple[_StagePlan, ...]


class P2pFFNEndpoint(FFNEndpoint):
    """The FFN side of P2P (see the module docstring).

    ``links`` are the FFN rank's links to the attention ranks of its block (their data
    transports carry the layers; a lost replaceable link drops out of the step in
    flight, see :mod:`afd_core.runtime.links`); ``replays`` bounds the FFN rank's own graph
    replays (None: no graph steps).
    """

    def __init__(
        self,
        context: EndpointContext,
        *,
        links: FFNLinks,
        inbox: ControlInbox,
        replays: ReplayGuard | None = None,
    ) -> None:
        import torch

        wire = context.wire
        self._wire, self._role_rank = wire, context.role_rank
        self._fuse, self._timeout_s = context.fuse, context.timeout_s
        self._links = links
        self._device = context.transport.device
        self._on_host = self._device.type == "cpu"
        self._inbox = inbox
        self._replays = replays
        self._dtype = getattr(torch, wire.dtype)
        self._logits_dtype = getattr(torch, wire.router_logits_dtype)
        self._layers = wire.exchange_layers
        self._index = {layer: i for i, layer in enumerate(self._layers)}
        self._exchanges = StepExchanges(self._layers, f"FFN rank {self._role_rank}")
        self._header_writer = HeaderWriter(wire)
        self._plan: _StepPlan | None = None
        # Reused from step to step: input tensors per stage, header blocks per link, frame
        # buffers (received, reply) per link and stage (host transports).
        self._inputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._headers: dict[int, tuple[AttentionLink, IncomingHeaders, OutgoingHeaders]] = {}
        self._frame_buffers: dict[
            tuple[int, int], tuple[AttentionLink, FrameBuffer, FrameBuffer]
        ] = {}

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        return self._inbox.next_step()

    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            return self._recv(step, layer, stage)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    def _recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        plan = self._stage(step, layer, stage)
        if step.is_graph_step:
            raise AFDProtocolError(
                f"AFD: step {step.payloads[0].step_id} is a CUDA graph step; its messages carry "
                "no headers: use recv_into/send_from"
            )
        with_logits = self._wire.logits_width_at(layer) > 0
        row = self._exchanges.take(layer, stage)
        plan.received = (layer, row)
        solo = plan.solo
        if solo is not None:
            if solo.link.lost is None:
                message = self._received_message(solo, with_logits)
                if self._exchange_solo(solo, layer, solo.to_peer.post_recv, message):
                    self._take_in(solo, row, with_logits)
        else:

            def post(member: _Member) -> list[Transfer]:
                if member.frames is not None:
                    return [member.to_peer.post_recv(self._received_message(member, with_logits))]
                logits = member.logits if with_logits else None
                messages = headed(member.incoming.row(row), (member.hidden, logits))
                return [member.to_peer.post_recv(t) for t in messages]

            for member in self._exchange(plan, layer, post):
                if member.link.lost is None:
                    self._take_in(member, row, with_logits)
        logits = plan.logits if with_logits else None
        return FFNLayerBatch(step, layer, stage, plan.hidden, plan.splits, logits)

    @staticmethod
    def _received_message(member: _Member, with_logits: bool) -> torch.Tensor:
        """The tensor ``member``'s frame is received into (the frame's exact size)."""
        assert member.frames is not None
        frame = member.frames.received
        return frame.message_with_logits if with_logits else frame.message

    @staticmethod
    def _take_in(member: _Member, row: int, with_logits: bool) -> None:
        """Check what ``member`` sent for message ``row``; rows of a frame that is not the
        batch itself go to their place in the stage's input tensors."""
        frames = member.frames
        if frames is None:
            if member.incoming.checks_each_message:
                member.incoming.check(row)
            return
        frame = frames.received
        member.incoming.check_at(row, frame.address)
        if frames.copy_in:
            layout = frame.layout
            memmove(frames.hidden_at, frame.address + HEADER_BYTES, layout.hidden_bytes)
            if with_logits:
                memmove(frames.logits_at, frame.address + layout.logits_at, layout.logits_bytes)

    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            self._send(batch, output)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    def _send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        step, layer, stage = batch.step, batch.layer, batch.stage
        plan = self._stage(step, layer, stage)
        if output.shape != (plan.total, self._wire.hidden_size) or output.dtype != self._dtype:
            self._reject_output(output, plan.total)
        if not (output.is_cpu and self._on_host) and output.device != self._device:
            output = output.to(self._device)  # a host transport serving a device model
        row = self._received_row(plan, layer, stage)
        if not output.is_contiguous():
            output = output.contiguous()
        address = output.data_ptr()
        solo = plan.solo
        if solo is not None:
            if solo.link.lost is None:
                message = self._reply_message(solo, row, address)
                self._exchange_solo(solo, layer, solo.to_peer.post_send, message)
        else:

            def post(member: _Member) -> list[Transfer]:
                if member.frames is not None:
                    return [member.to_peer.post_send(self._reply_message(member, row, address))]
                messages = headed(member.outgoing.row(row), (output[member.rows],))
                return [member.to_peer.post_send(t) for t in messages]

            self._exchange(plan, layer, post)
        self._finish_exchange(step)

    @staticmethod
    def _reply_message(member: _Member, row: int, address: int) -> torch.Tensor:
        """``member``'s reply frame for message ``row``, filled: its header, then its rows
        of the output at host ``address``."""
        frames = member.frames
        assert frames is not None
        frame = frames.reply
        memmove(frame.address, member.outgoing.address(row), HEADER_BYTES)
        rows_at = address + frames.output_at
        memmove(frame.address + HEADER_BYTES, rows_at, frame.layout.hidden_bytes)
        return frame.message

    @guarded
    def recv_into(
        self,
        step: FFNStep,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
    ) -> None:
        plan = self._graph_stage(step, layer, stage)
        width = self._wire.logits_width_at(layer)
        self._check_graph_tensor("hidden", hidden, plan.total, self._wire.hidden_size)
        if (router_logits is None) != (width == 0):
            raise AFDProtocolError(
                f"AFD: layer {layer} has {width} router-logit columns on the wire; pass "
                "router_logits exactly when it has some"
            )
        if router_logits is not None:
            self._check_graph_tensor("router_logits", router_logits, plan.total, width)

        def post(member: _Member) -> list[Transfer]:
            targets = [hidden[member.rows]]
            if router_logits is not None:
                targets.append(router_logits[member.rows])
            return [member.to_peer.post_recv(t) for t in targets]

        self._exchange(plan, layer, post)

    @guarded
    def send_from(self, step: FFNStep, layer: int, stage: int, output: torch.Tensor) -> None:
        plan = self._graph_stage(step, layer, stage)
        self._check_graph_tensor("output", output, plan.total, self._wire.hidden_size)

        def post(member: _Member) -> list[Transfer]:
            return [member.to_peer.post_send(output[member.rows])]

        self._exchange(plan, layer, post)

    @guarded
    def wait_for_stream(self, what: str) -> None:
        if self._replays is None:
            super().wait_for_stream(what)
            return
        self._replays.wait_for_stream(what)

    def stats(self) -> dict[str, object]:
        """``{"linked_attention_ranks": [...], "attention_replacements": n,
        "last_peer_loss": {"error", "unix_time"} | None}``: the attention ranks linked now,
        how many servers took the seat of one that left, and the last link let go."""
        linked = sorted(r for r, link in self._links.current().items() if link.lost is None)
        return {
            "linked_attention_ranks": linked,
            "attention_replacements": self._links.replacements,
            "last_peer_loss": loss_record(self._links.last_loss),
        }

    # Step plans ------------------------------------------------------------------------

    def _stage(self, step: FFNStep, layer: int, stage: int) -> _StagePlan:
        """The plan of ``step``'s ``stage`` (made at the step's first call), checked."""
        if layer not in self._index:
            raise AFDProtocolError(
                f"AFD: layer {layer} is not an exchange layer of the wire spec {self._layers}"
            )
        if not 0 <= stage < step.num_stages:
            raise AFDProtocolError(
                f"AFD: stage {stage} is outside the step's {step.num_stages} stage(s)"
            )
        plan = self._plan
        if plan is None or plan.step is not step:
            plan = self._plan = self._make_plan(step)
        return plan.stages[stage]

    def _graph_stage(self, step: FFNStep, layer: int, stage: int) -> _StagePlan:
        if not step.is_graph_step:
            raise AFDProtocolError(
                f"AFD: step {step.payloads[0].step_id} is not a CUDA graph step; its messages "
                "carry headers: use recv/send"
            )
        return self._stage(step, layer, stage)

    def _make_plan(self, step: FFNStep) -> _StepPlan:
        # Graph steps make no host calls per layer when replayed: nothing to count.
        self._exchanges.begin(step.payloads[0].step_id, step.num_stages,
                              exchanges=not step.is_graph_step)  # fmt: skip
        stages = []
        rows_per_step = step.num_stages * len(self._layers)
        for stage in range(step.num_stages):
            counts = step.stage_tokens(stage)
            total = sum(counts)
            links = [self._links.get(rank) for rank in step.attention_ranks]
            frames = [
                None if step.is_graph_step else self._frames_of(link, stage, n)
                for link, n in zip(links, counts, strict=True)
            ]
            solo = len(links) == 1 and frames[0] is not None
            if solo:  # the batch is the rank's frame
                hidden, logits = self._frame_inputs(frames[0][0])
            else:
                hidden, logits = self._stage_inputs(stage, total)
                hidden = hidden[:total]
                logits = None if logits is None else logits[:total]
            row_bytes = self._wire.hidden_size * hidden.element_size()
            members, start = [], 0
            for i, (link, payload, n) in enumerate(zip(links, step.payloads, counts, strict=True)):
                incoming, outgoing = self._link_headers(link, rows_per_step)
                rows = slice(start, start + n)
                rows_hidden = hidden[rows]
                rows_logits = None if logits is None else logits[rows]
                member_frames = None
                if frames[i] is not None:
                    member_frames = _MemberFrames(
                        *frames[i], copy_in=len(links) > 1,
                        hidden_at=rows_hidden.data_ptr(),
                        logits_at=0 if rows_logits is None else rows_logits.data_ptr(),
                        output_at=start * row_bytes,
                    )  # fmt: skip
                to_peer = link.data.to_peer(link.peer, self._timeout_s)
                members.append(
                    _Member(link.rank, link, to_peer, payload.step_id, rows, n, incoming, outgoing,
                            rows_hidden, rows_logits, member_frames)
                )  # fmt: skip
                start += n
            stages.append(
                _StagePlan(tuple(members), total, hidden, logits, counts,
                           members[0] if solo else None)
            )  # fmt: skip
        plan = _StepPlan(step, tuple(stages))
        if not step.is_graph_step:
            self._write_headers(plan)
        return plan

    def _write_headers(self, plan: _StepPlan) -> None:
        """Every header of the step: expected from each rank, and sent back to it."""
        for stage, stage_plan in enumerate(plan.stages):
            for member in stage_plan.members:
                self._header_writer.write_stage(member.incoming.view, member.outgoing.view,
                                                member.step_id, stage, member.count,
                                                member.rank, self._role_rank)  # fmt: skip
        for member in plan.stages[0].members:
            member.incoming.publish()
            member.outgoing.publish()

    def _stage_inputs(self, stage: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stage's input tensors, at least ``rows`` long (grown when too short)."""
        import torch

        inputs = self._inputs.get(stage)
        if inputs is None or inputs[0].shape[0] < rows:
            device, width = self._device, self._wire.router_logits_width
            capacity = max(rows, 1)
            hidden = torch.empty(
                (capacity, self._wire.hidden_size), dtype=self._dtype, device=device
            )
            logits = None
            if width:
                logits = torch.empty((capacity, width), dtype=self._logits_dtype, device=device)
            inputs = self._inputs[stage] = (hidden, logits)
        return inputs

    def _frames_of(
        self, link: AttentionLink, stage: int, rows: int
    ) -> tuple[HeldFrame, HeldFrame] | None:
        """``link``'s frames for ``stage`` (received, reply), laid out for ``rows`` rows;
        None when messages of that many rows are not frames on its transport."""
        layout = FrameLayout.of(self._wire, rows)
        if not uses_frames(link.data, layout):
            return None
        key = (link.rank, stage)
        cached = self._frame_buffers.get(key)
        if cached is None or cached[0] is not link:
            cached = self._frame_buffers[key] = (link, FrameBuffer(), FrameBuffer())
        return cached[1].hold(layout), cached[2].hold(layout)

    def _frame_inputs(self, frame: HeldFrame) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The hidden states and router logits of a batch that is ``frame``'s rows."""
        wire = self._wire
        hidden = frame.hidden(wire.hidden_size, self._dtype)
        if not wire.router_logits_width:
            return hidden, None
        return hidden, frame.logits(wire.router_logits_width, self._logits_dtype)

    def _link_headers(
        self, link: AttentionLink, rows: int
    ) -> tuple[IncomingHeaders, OutgoingHeaders]:
        cached = self._headers.get(link.rank)
        if cached is None or cached[0] is not link or cached[2].rows < rows:
            incoming = IncomingHeaders(link.data, rows, link.name)
            cached = (link, incoming, OutgoingHeaders(link.data, rows))
            self._headers[link.rank] = cached
        return cached[1], cached[2]

    # Transfers -------------------------------------------------------------------------

    def _exchange(
        self, plan: _StagePlan, layer: int, post: Callable[[_Member], list[Transfer]]
    ) -> list[_Member]:
        """``post(member)`` for every member whose link is not lost, then wait for all
        (bounded); a member whose transfer fails is lost (:meth:`_lose`). Returns the
        members that took part."""
        posted = []
        for member in plan.members:
            if member.link.lost is not None:
                continue
            try:
                posted.append((member, post(member)))
            except TransferFailed as exc:
                self._lose(member, exc, layer)
        self._wait(posted, layer)
        return [member for member, _ in posted]

    def _exchange_solo(
        self,
        member: _Member,
        layer: int,
        post: Callable[[torch.Tensor], Transfer],
        message: torch.Tensor,
    ) -> bool:
        """:meth:`_exchange` for a stage's one member and one frame: ``post(message)`` on
        its peer transport, then wait. False when it failed and the member was lost."""
        try:
            member.to_peer.wait_all([post(message)])
        except TransferFailed as exc:
            self._lose(member, exc, layer)
            return False
        return True

    def _wait(self, posted: list[tuple[_Member, list[Transfer]]], layer: int) -> None:
        """Wait for every transfer posted, member by member, under one deadline."""
        deadline = time.monotonic() + self._timeout_s
        for member, transfers in posted:
            try:
                member.to_peer.wait_all(transfers, deadline)
            except TransferFailed as exc:
                self._lose(member, exc, layer)

    def _lose(self, member: _Member, failure: TransferFailed, layer: int) -> None:
        """A transfer of ``member`` failed: drop it from the step when the links let its
        link go (its rows are zeroed: nothing of them is sent anywhere), else raise the
        error. A message that breaks the protocol is never let go: it fails the rank."""
        self._links.lose_transfer(member.link, failure, layer_of_step(layer, member.step_id))
        member.hidden.zero_()
        if member.logits is not None:
            member.logits.zero_()

    def _received_row(self, plan: _StagePlan, layer: int, stage: int) -> int:
        """The row of ``layer`` in ``stage``, whose result is about to be sent: the layer
        the stage received last; AFDProtocolError for any other."""
        received, plan.received = plan.received, None
        if received is None or received[0] != layer:
            got = "nothing" if received is None else f"layer {received[0]}"
            raise AFDProtocolError(
                f"AFD: FFN rank {self._role_rank} sends the result of layer {layer} stage "
                f"{stage}, but received {got} for that stage; call recv() and send() in pairs"
            )
        return received[1]

    def _finish_exchange(self, step: FFNStep) -> None:
        """Count a finished (layer, stage); after the step's last, run deferred checks."""
        plan = self._plan
        assert plan is not None and plan.step is step
        if not self._exchanges.finish():
            return
        members = [m for m in plan.stages[0].members if m.link.lost is None]
        if not members or members[0].incoming.checks_each_message:
            return
        deadline = time.monotonic() + self._timeout_s
        for transport in {id(m.link.data): m.link.data for m in members}.values():
            try:
                transport.synchronize(deadline)
            except TransferFailed as exc:
                raise members[0].link.failures.error(exc, f"step {members[0].step_id}") from None
        for member in members:
            member.incoming.check_all(self._exchanges.expected)

    def _reject_output(self, output: torch.Tensor, rows: int) -> None:
        size = self._wire.hidden_size
        if output.shape != (rows, size) or output.dtype != self._dtype:
            raise AFDProtocolError(
                f"AFD: output is {tuple(output.shape)} {output.dtype}, the step and wire spec "
                f"say ({rows}, {size}) {self._dtype}"
            )

    @staticmethod
    def _check_graph_tensor(name: str, tensor: torch.Tensor, rows: int, cols: int) -> None:
        if tensor.shape != (rows, cols) or not tensor.is_contiguous():
            raise AFDProtocolError(
                f"AFD: {name} is {tuple(tensor.shape)}; the graph step needs a contiguous "
                f"({rows}, {cols}) tensor"
            )
