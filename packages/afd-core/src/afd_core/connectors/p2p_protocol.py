"""``P2pProtocolConnector``: the P2P wire protocol over abstract transport primitives.

It implements everything that does not depend on the transport: the control plane
(fixed-size frames; the FFN side's :class:`~afd_core.connectors.p2p_control.ControlInbox`),
packing a header, hidden states and router logits into one message
(:mod:`~afd_core.connectors.p2p_buffers`), the sender-side checks that keep both sides'
message sizes equal, the receiver-side header checks, concatenating a block and
splitting the result back. The byte formats are in :mod:`afd_core.connectors.p2p_wire`;
``docs/wire-protocol.md`` describes the whole protocol.

A transport subclasses it and implements ``_post_send``, ``_post_recv``, ``_wait``,
``_initialize`` (ending with :meth:`_start_protocol`) and ``_close`` (calling
:meth:`_stop_protocol`); a device transport also overrides ``_allocate``, ``_read_bytes``
and ``_write_bytes``. Importing this module imports no torch.
"""

from __future__ import annotations

import ctypes
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from afd_core.connector import Connector, ControlPlane, FFNLayerBatch, FFNStep, WireSpec
from afd_core.connectors.p2p_buffers import MessageBuffers, Slot
from afd_core.connectors.p2p_control import ControlInbox
from afd_core.connectors.p2p_graph import GraphStepsMixin
from afd_core.connectors.p2p_wire import (
    CONTROL_FRAME_BYTES,
    DTYPE_SIZES,
    HEADER_BYTES,
    TAG_A2F,
    TAG_CONTROL,
    TAG_F2A,
    HeaderPacker,
    a2f_header,
    check_received,
    describe_rank,
    encode_control_frame,
    f2a_header,
    header_differences,
    with_layer,
)
from afd_core.errors import (
    AFDConfigError,
    AFDError,
    AFDPeerError,
    AFDProtocolError,
    AFDShutdown,
)
from afd_core.metadata import ControlPayload, TransferHeader

if TYPE_CHECKING:
    import torch

    from afd_core.config import AFDConfig

#: What a wait is for: a description, or ``(layer, step_id)`` of a data message.
Purpose = str | tuple[int, int]


def describe_purpose(what: Purpose) -> str:
    """``"layer 3 of step 17"`` for ``(3, 17)``; a string unchanged."""
    return what if isinstance(what, str) else f"layer {what[0]} of step {what[1]}"


class _BlockEntry:
    """FFN side: one attention rank of a step, for one stage."""

    __slots__ = ("header", "peer", "rank", "recv_key", "rows", "send_key", "step_id")

    def __init__(
        self, rank: int, peer: int, step_id: int, rows: int, stage: int, header: TransferHeader
    ) -> None:
        self.rank, self.peer, self.step_id, self.rows = rank, peer, step_id, rows
        self.recv_key, self.send_key = ("a2f", rank, stage), ("f2a", rank, stage)
        self.header = header  # layer 0; with_layer() gives the header of any layer


class _P2pControlPlane(ControlPlane):
    """The control channel of a :class:`P2pProtocolConnector`."""

    def __init__(self, connector: P2pProtocolConnector) -> None:
        self._connector = connector

    def send_step(self, payload: ControlPayload) -> None:
        self._connector._send_step(payload)

    def recv_step(self) -> FFNStep | None:
        return self._connector._recv_step()


class P2pProtocolConnector(GraphStepsMixin, Connector):
    """The P2P protocol over abstract transport primitives (see the module docstring).

    Threading: the data-plane methods and ``send_step`` are called from one thread;
    ``recv_step`` from one thread (the FFN loop); :meth:`close` from any thread.

    Every forward of an attention rank exchanges at every one of
    ``wire.num_exchange_layers`` layers and every stage: ``send_step`` refuses to start
    a step while the previous one is incomplete, since the FFN rank would misread it.

    Buffers are reused per (direction, peer, stage) and grow to the largest message
    seen. The tensors of an :class:`FFNLayerBatch` stay valid until the next
    ``recv_hidden`` of the same stage.
    """

    #: Attention side: post the reply's receive before the send (gloo). A transport whose
    #: p2p ops between two ranks run in posting order on one stream (NCCL) sets False:
    #: a receive posted first would block the send the FFN rank waits for.
    _recv_reply_first: ClassVar[bool] = True

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        super().__init__(config, role_rank, wire)
        for name in (wire.dtype, wire.router_logits_dtype):
            if name not in DTYPE_SIZES:
                raise AFDConfigError(
                    f"AFD wire: dtype {name!r} cannot travel on the wire; use one of "
                    f"{sorted(DTYPE_SIZES)} (--dtype of both roles)"
                )
        self._timeout_s = float(config.afd_process_group_timeout_s)
        self._control = _P2pControlPlane(self)
        self._headers = HeaderPacker(wire)
        self._torch: Any = None
        self._buffers: MessageBuffers | None = None
        self._slots: dict[tuple[object, ...], Slot] = {}
        # Attention side, per stage: (send, receive, receive slot, layer, step) in flight.
        self._inflight: dict[int, tuple[Any, Any, Slot, int, int]] = {}
        self._failure: AFDError | None = None
        # Attention side: the FFN rank, what this rank announced, exchanges done and
        # expected, and whether the announced step is a CUDA graph step.
        self._announced: tuple[int, tuple[int, ...]] | None = None
        self._exchanges = 0
        self._expected_exchanges = 0
        self._graph_step = False
        self._control_frame: Any = None
        if config.role == "attention":
            self._ffn_rank = self.topology.ffn_rank_of(role_rank)
            self._ffn_world = self.topology.world_rank("ffn", self._ffn_rank)
        # FFN side: the control payloads of the block.
        block = self.topology.block_of(role_rank) if config.role == "ffn" else range(0)
        self._attention_world = {a: self.topology.world_rank("attention", a) for a in block}
        self._plans: dict[int, tuple[FFNStep, tuple[_BlockEntry, ...]]] = {}
        self._inbox = ControlInbox(self, block)

    # Transport primitives ------------------------------------------------------------

    @abstractmethod
    def _post_send(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        """Start sending the uint8 tensor ``buf`` to world rank ``peer``; return a handle.

        ``buf`` must not change until :meth:`_wait` on the handle returned.
        """

    @abstractmethod
    def _post_recv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        """Start receiving exactly ``buf.numel()`` bytes from world rank ``peer``."""

    @abstractmethod
    def _wait(self, handle: Any, peer: int, deadline: float | None, what: Purpose) -> None:
        """Wait for ``handle`` until ``deadline`` (``time.monotonic()``; None: forever).

        Raise AFDShutdown when the connector was closed meanwhile, else AFDPeerError
        (built by :meth:`_peer_failure`).
        """

    def _allocate(self, nbytes: int) -> torch.Tensor:
        """A new uint8 buffer of ``nbytes`` that the transport sends from (CPU here)."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8)

    def _allocate_control(self, nbytes: int) -> torch.Tensor:
        """A new uint8 buffer for one control frame (default: :meth:`_allocate`)."""
        return self._allocate(nbytes)

    def _read_bytes(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at buffer address ``addr`` (CPU here)."""
        return ctypes.string_at(addr, nbytes)

    def _write_bytes(self, addr: int, data: bytes) -> None:
        """Write ``data`` at buffer address ``addr`` (CPU here)."""
        ctypes.memmove(addr, data, len(data))

    # Life cycle helpers for subclasses -------------------------------------------------

    def _start_protocol(self) -> None:
        """Call at the end of ``_initialize`` once the transport is up."""
        import torch

        self._buffers = MessageBuffers(self.wire, self._allocate)
        self._slots = self._buffers.slots
        self._dtype = self._buffers.dtype
        self._logits_dtype = self._buffers.logits_dtype
        self._torch = torch
        if self.config.role == "ffn":
            self._inbox.start()
        else:
            self._control_frame = self._allocate_control(CONTROL_FRAME_BYTES)

    def _stop_protocol(self, join_timeout_s: float = 2.0) -> None:
        """Call from ``_close`` once the transport woke its waiters."""
        self._inbox.stop(join_timeout_s)
        self._inflight.clear()
        self._plans.clear()
        self._control_frame = None
        if self._buffers is not None:
            self._buffers.clear()

    def _wake_waiters(self) -> None:
        self._inbox.wake()

    def _peer_failure(self, peer: int, what: Purpose, detail: str, timed_out: bool) -> AFDError:
        """The error for a failed wait on world rank ``peer`` (see :meth:`_wait`)."""
        doing = describe_purpose(what)
        if self.is_closed:
            return AFDShutdown(f"AFD: {self.name} was closed while waiting for {doing}")
        role, rank = self.topology.role_of_world_rank(peer)
        who = describe_rank(self.topology, role, rank)
        if timed_out:
            return AFDPeerError(
                f"AFD: {who} did not answer within {self._timeout_s:g} s ({doing}); it is "
                "stuck or overloaded, or the roles disagree on the step sequence "
                f"(afd_process_group_timeout_s sets this limit) [{detail}]"
            )
        return AFDPeerError(
            f"AFD: {who} closed the connection during {doing}; the "
            f"{'FFN' if role == 'ffn' else 'attention'} role stopped or crashed — see its "
            f"log [{detail}]"
        )

    # Shared helpers --------------------------------------------------------------------

    @property
    def control_plane(self) -> ControlPlane:
        return self._control

    def _raise_unusable(self) -> None:
        if self.is_closed:
            raise AFDShutdown(f"AFD: {self.name} is closed")
        if self._failure is not None:
            raise type(self._failure)(
                f"{self._failure} (this connector failed earlier; close it and start again)"
            )
        raise RuntimeError(f"{self.name}: call initialize() before exchanging data")

    def _fail(self, exc: AFDError) -> None:
        """Remember ``exc`` (unless it is AFDShutdown): later calls raise it again.

        Keeps a copy without traceback: the traceback's frames would hold transport
        handles, and through them the process group and its port, after close().
        """
        if not isinstance(exc, AFDShutdown):
            self._failure = type(exc)(str(exc))

    def _reject_rows(self, name: str, tensor: Any, rows: int, cols: int, dtype: Any) -> None:
        raise AFDProtocolError(
            f"AFD: {name} is {tuple(tensor.shape)} {tensor.dtype}, the header and wire spec "
            f"say ({rows}, {cols}) {dtype}"
        )

    # Attention side --------------------------------------------------------------------

    def _send_step(self, payload: ControlPayload) -> None:
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        if self.config.role != "attention":
            raise RuntimeError(f"{self.name}: send_step is for the attention role")
        if payload.sender_rank != self.role_rank:
            raise AFDProtocolError(
                f"AFD control: attention rank {self.role_rank} was asked to send a payload "
                f"signed by attention rank {payload.sender_rank}"
            )
        tokens = payload.tokens_of(self.role_rank)
        if self._announced is not None and self._exchanges != self._expected_exchanges:
            step_id, stages = self._announced
            exc = AFDProtocolError(
                f"AFD: attention rank {self.role_rank} starts step {payload.step_id} after "
                f"{self._exchanges} layer exchanges in step {step_id}, expected "
                f"{self._expected_exchanges} ({self.wire.num_exchange_layers} layers x "
                f"{len(stages)} stages, none for a graph replay); every forward must "
                "exchange at every layer and stage"
            )
            self._fail(exc)
            raise exc
        frame = self._control_frame
        self._write_bytes(frame.data_ptr(), encode_control_frame(payload))
        deadline = time.monotonic() + self._timeout_s
        try:
            handle = self._post_send(frame, self._ffn_world, TAG_CONTROL)
            self._wait(
                handle, self._ffn_world, deadline, f"the control payload of step {payload.step_id}"
            )
        except AFDError as exc:
            self._fail(exc)
            raise
        self._announced = (payload.step_id, tokens)
        self._exchanges = 0
        self._graph_step = payload.is_graph_step
        replayed = payload.is_graph_step and not payload.is_graph_capturing
        self._expected_exchanges = 0 if replayed else len(tokens) * self.wire.num_exchange_layers

    def _reject_header(self, header: TransferHeader, direction: str) -> None:
        """Raise AFDProtocolError explaining why ``header`` cannot be exchanged now."""
        if self._announced is None or header.step_id != self._announced[0]:
            raise AFDProtocolError(
                f"AFD: attention rank {self.role_rank} exchanges step {header.step_id} but "
                f"announced step {self._announced[0] if self._announced else None}; call "
                "control_plane.send_step() first"
            )
        stages = self._announced[1]
        if not 0 <= header.stage < len(stages):
            raise AFDProtocolError(
                f"AFD: stage {header.stage} is outside step {header.step_id}'s "
                f"{len(stages)} stage(s)"
            )
        n = stages[header.stage]
        if direction == "a2f":
            expected = a2f_header(
                header.step_id, header.layer, header.stage, n, self.role_rank, self.wire
            )
            diffs = header_differences(header, expected)
        else:
            diffs = [f"num_tokens={header.num_tokens} (expected {n})"]
        raise AFDProtocolError(
            f"AFD: attention rank {self.role_rank} was given a header that differs from what "
            f"it announced for step {header.step_id} stage {header.stage} and from the wire "
            f"spec: {'; '.join(diffs)}"
        )

    def send_hidden(
        self,
        header: TransferHeader,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None = None,
    ) -> None:
        """Pack ``header``, ``hidden`` and ``router_logits`` into one message and send it.

        The header must match the token count announced for its stage and the wire spec,
        so that the FFN rank expects exactly this many bytes (AFDProtocolError
        otherwise); ``router_logits`` is required exactly when the wire spec has router
        logits. Posts the receive of the reply and the send (in the order
        ``_recv_reply_first`` says) and returns; the matching :meth:`recv_output`
        completes both.
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        wire, announced, stage = self.wire, self._announced, header.stage
        width = wire.logits_width_at(header.layer)
        if (
            announced is None
            or header.step_id != announced[0]
            or header.direction != "a2f"
            or not 0 <= stage < len(announced[1])
            or header.num_tokens != announced[1][stage]
            or header.sender_rank != self.role_rank
            or header.dtype != wire.dtype
            or header.hidden_size != wire.hidden_size
            or header.logits_width != width
            or (width and header.logits_dtype != wire.router_logits_dtype)
        ):
            self._reject_header(header, "a2f")
        n = header.num_tokens
        if hidden.shape != (n, wire.hidden_size) or hidden.dtype != self._dtype:
            self._reject_rows("hidden", hidden, n, wire.hidden_size, self._dtype)
        if (router_logits is None) != (width == 0):
            raise AFDProtocolError(
                f"AFD: router_logits {'missing' if router_logits is None else 'given'} for "
                f"layer {header.layer}, whose wire spec has {width} router-logit columns; "
                "compute_gate_on_attention decides whether the attention role sends router "
                "logits, and dense layers never do"
            )
        if router_logits is not None and (
            router_logits.shape != (n, width) or router_logits.dtype != self._logits_dtype
        ):
            self._reject_rows("router_logits", router_logits, n, width, self._logits_dtype)
        if stage in self._inflight:
            raise AFDProtocolError(
                f"AFD: attention rank {self.role_rank} sends layer {header.layer} stage {stage} "
                "while the previous exchange of that stage awaits recv_output()"
            )
        if self._graph_step:
            self._send_hidden_headerless(header, hidden, router_logits)
            return
        key, reply_key = ("a2f", stage), ("f2a", stage)
        slot = self._slots.get(key)
        if slot is None or slot.rows != n or (slot.logits_nbytes > 0) != (width > 0):
            slot = self._buffers.slot(key, n, width > 0)
        reply = self._slots.get(reply_key)
        if reply is None or reply.rows != n:
            reply = self._buffers.slot(reply_key, n, False)
        try:
            # The reply's receive goes first where the transport allows it (see
            # _recv_reply_first), so the FFN rank never waits for it.
            received = None
            if self._recv_reply_first:
                received = self._post_recv(reply.buf, self._ffn_world, TAG_F2A)
            self._write_bytes(
                slot.addr, self._headers.a2f(header.step_id, header.layer, stage, n, self.role_rank)
            )
            if n:
                slot.hidden.copy_(hidden)
                if router_logits is not None:
                    self._buffers.pack_logits(slot, router_logits)
            sent = self._post_send(slot.buf, self._ffn_world, TAG_A2F)
            if received is None:
                received = self._post_recv(reply.buf, self._ffn_world, TAG_F2A)
        except AFDError as exc:
            self._fail(exc)
            raise
        self._inflight[stage] = (sent, received, reply, header.layer, header.step_id)

    def recv_output(self, header: TransferHeader, out: torch.Tensor) -> torch.Tensor:
        """Receive the FFN result for ``header``'s step, layer and stage into ``out``.

        ``header`` may be the header of the matching :meth:`send_hidden` (only its step,
        layer, stage and token count are used). The received header is checked against
        the expected f2a header; a mismatch raises AFDProtocolError naming both views.
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        announced, stage = self._announced, header.stage
        if (
            announced is None
            or header.step_id != announced[0]
            or not 0 <= stage < len(announced[1])
            or header.num_tokens != announced[1][stage]
        ):
            self._reject_header(header, "f2a")
        n, layer = header.num_tokens, header.layer
        if out.shape != (n, self.wire.hidden_size) or out.dtype != self._dtype:
            self._reject_rows("out", out, n, self.wire.hidden_size, self._dtype)
        inflight = self._inflight.pop(stage, None)
        if inflight is None or inflight[3:] != (layer, header.step_id):
            sent_what = (
                "nothing for that stage"
                if inflight is None
                else f"layer {inflight[3]} of step {inflight[4]}"
            )
            exc = AFDProtocolError(
                f"AFD: attention rank {self.role_rank} asks for the result of layer {layer} "
                f"stage {stage} of step {header.step_id}, but sent {sent_what}; call "
                "send_hidden() and recv_output() in pairs"
            )
            if inflight is not None:  # its receive stays posted: the stream is lost
                self._fail(exc)
            raise exc
        sent, received, slot = inflight[:3]
        if self._graph_step:
            return self._recv_output_headerless(header, sent, out)
        deadline = time.monotonic() + self._timeout_s
        what = (layer, header.step_id)
        try:
            self._wait(sent, self._ffn_world, deadline, what)
            self._wait(received, self._ffn_world, deadline, what)
            if self._read_bytes(slot.addr, HEADER_BYTES) != self._headers.f2a(
                header.step_id, layer, stage, n, self._ffn_rank
            ):
                check_received(
                    self._read_bytes(slot.addr, HEADER_BYTES),
                    f2a_header(header.step_id, layer, stage, n, self._ffn_rank, self.wire),
                    describe_rank(self.topology, "ffn", self._ffn_rank),
                )
        except AFDError as exc:
            self._fail(exc)
            raise
        if n:
            out.copy_(slot.hidden)
        self._exchanges += 1
        return out

    # FFN side --------------------------------------------------------------------------

    def _recv_step(self) -> FFNStep | None:
        if self.is_closed:
            return None
        if self._failure is not None or self._torch is None:
            self._raise_unusable()
        if self.config.role != "ffn":
            raise RuntimeError(f"{self.name}: recv_step is for the FFN role")
        try:
            return self._inbox.next_step()
        except AFDError as exc:
            self._fail(exc)
            raise

    def _block_plan(self, step: FFNStep, stage: int) -> tuple[_BlockEntry, ...]:
        """Per-rank facts of ``step`` and ``stage``, computed once for all its layers."""
        plan = self._plans.get(stage)
        if plan is not None and plan[0] is step:
            return plan[1]
        entries = tuple(
            _BlockEntry(
                rank,
                self._attention_world[rank],
                payload.step_id,
                counts[stage],
                stage,
                a2f_header(payload.step_id, 0, stage, counts[stage], rank, self.wire),
            )
            for payload, rank, counts in zip(
                step.payloads, step.attention_ranks, step.tokens, strict=True
            )
        )
        self._plans[stage] = (step, entries)
        return entries

    def recv_hidden(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """Receive one layer's input from every attention rank of ``step``, concatenated.

        Each received header is checked (AFDProtocolError naming both views). With one
        attention rank the tensors are views of the receive buffer (no copy).
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        if not 0 <= stage < step.num_stages:
            raise AFDProtocolError(
                f"AFD: stage {stage} is outside the step's {step.num_stages} stage(s)"
            )
        with_logits = self.wire.logits_width_at(layer) > 0
        entries = self._block_plan(step, stage)
        deadline = time.monotonic() + self._timeout_s
        slots = []
        try:
            posted = []
            for entry in entries:
                slot = self._slots.get(entry.recv_key)
                if (
                    slot is None
                    or slot.rows != entry.rows
                    or (slot.logits_nbytes > 0) != with_logits
                ):
                    slot = self._buffers.slot(entry.recv_key, entry.rows, with_logits)
                slots.append(slot)
                posted.append(self._post_recv(slot.buf, entry.peer, TAG_A2F))
            for handle, slot, entry in zip(posted, slots, entries, strict=True):
                self._wait(handle, entry.peer, deadline, (layer, entry.step_id))
                raw = self._read_bytes(slot.addr, HEADER_BYTES)
                if raw != self._headers.a2f(entry.step_id, layer, stage, entry.rows, entry.rank):
                    check_received(
                        raw,
                        with_layer(entry.header, layer),
                        describe_rank(self.topology, "attention", entry.rank),
                    )
        except AFDError as exc:
            self._fail(exc)
            raise
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=self._buffers.concat(("cat", stage), [s.hidden for s in slots], self._dtype),
            router_logits=self._buffers.concat(
                ("catl", stage), [self._buffers.unpack_logits(s) for s in slots], self._logits_dtype
            )
            if with_logits
            else None,
            splits=tuple(e.rows for e in entries),
            headers=tuple(with_layer(e.header, layer) for e in entries),
        )

    def send_output(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Split ``output`` by ``batch.splits`` and send each part to its attention rank.

        Returns once every part is sent (a closing FFN rank never drops a result).
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        layer, stage = batch.layer, batch.stage
        entries = self._block_plan(batch.step, stage)
        rows = sum(e.rows for e in entries)
        if output.shape != (rows, self.wire.hidden_size) or output.dtype != self._dtype:
            self._reject_rows("output", output, rows, self.wire.hidden_size, self._dtype)
        deadline = time.monotonic() + self._timeout_s
        single = len(entries) == 1
        posted = []
        start = 0
        try:
            for entry in entries:
                n = entry.rows
                slot = self._slots.get(entry.send_key)
                if slot is None or slot.rows != n:
                    slot = self._buffers.slot(entry.send_key, n, False)
                self._write_bytes(
                    slot.addr, self._headers.f2a(entry.step_id, layer, stage, n, self.role_rank)
                )
                if n:
                    slot.hidden.copy_(output if single else output[start : start + n])
                posted.append(self._post_send(slot.buf, entry.peer, TAG_F2A))
                start += n
            for handle, entry in zip(posted, entries, strict=True):
                self._wait(handle, entry.peer, deadline, (layer, entry.step_id))
        except AFDError as exc:
            self._fail(exc)
            raise
