"""``P2pProtocolConnector``: the P2P wire protocol over abstract transport primitives.

It implements everything that does not depend on the transport: the control plane
(fixed-size frames; on the FFN side one receiver thread per attention rank of the block
and step assembly), packing a header, hidden states and router logits into one message,
the sender-side checks that keep both sides' message sizes equal, the receiver-side
header checks, concatenating a block and splitting the result back. The byte formats are
in :mod:`afd_core.connectors.p2p_wire`; ``docs/wire-protocol.md`` describes both.

A transport subclasses it and implements ``_post_send``, ``_post_recv``, ``_wait``,
``_initialize`` (ending with :meth:`_start_protocol`) and ``_close`` (calling
:meth:`_stop_protocol`); a device transport also overrides ``_allocate``, ``_read_bytes``
and ``_write_bytes``. Importing this module imports no torch.
"""

from __future__ import annotations

import ctypes
import threading
import time
from abc import abstractmethod
from collections import deque
from typing import TYPE_CHECKING, Any

from afd_core.connector import Connector, ControlPlane, FFNLayerBatch, FFNStep, WireSpec
from afd_core.connectors.p2p_wire import (
    CONTROL_FRAME_BYTES,
    DTYPE_SIZES,
    HEADER_BYTES,
    TAG_A2F,
    TAG_CONTROL,
    TAG_F2A,
    HeaderPacker,
    StepAssembler,
    a2f_header,
    check_received,
    decode_control_frame,
    describe_rank,
    encode_control_frame,
    f2a_header,
    header_differences,
    hidden_nbytes,
    logits_nbytes,
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


class _Slot:
    """A reusable message buffer of one (direction, peer, stage) and its typed views.

    ``logits`` is None when the message has no router logits or when they are not
    aligned for their dtype (then they are copied byte-wise).
    """

    __slots__ = ("addr", "buf", "hidden", "logits", "logits_nbytes", "logits_offset", "rows")

    def __init__(
        self, rows: int, buf: Any, hidden: Any, logits: Any, offset: int, nbytes: int
    ) -> None:
        self.rows, self.buf, self.addr = rows, buf, buf.data_ptr()
        self.hidden, self.logits = hidden, logits
        self.logits_offset, self.logits_nbytes = offset, nbytes


class _P2pControlPlane(ControlPlane):
    """The control channel of a :class:`P2pProtocolConnector`."""

    def __init__(self, connector: P2pProtocolConnector) -> None:
        self._connector = connector

    def send_step(self, payload: ControlPayload) -> None:
        self._connector._send_step(payload)

    def recv_step(self) -> FFNStep | None:
        return self._connector._recv_step()


class P2pProtocolConnector(Connector):
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
        self._pool: dict[tuple[object, ...], Any] = {}
        self._slots: dict[tuple[object, ...], _Slot] = {}
        self._pending: dict[tuple[object, ...], tuple[Any, int, Purpose]] = {}
        self._failure: AFDError | None = None
        # Attention side: the FFN rank, what this rank announced, exchanges done.
        self._announced: tuple[int, tuple[int, ...]] | None = None
        self._exchanges = 0
        if config.role == "attention":
            self._ffn_rank = self.topology.ffn_rank_of(role_rank)
            self._ffn_world = self.topology.world_rank("ffn", self._ffn_rank)
        # FFN side: control queues filled by one receiver thread per attention rank.
        block = self.topology.block_of(role_rank) if config.role == "ffn" else range(0)
        self._attention_world = {a: self.topology.world_rank("attention", a) for a in block}
        self._assembler = StepAssembler(block)
        self._cond = threading.Condition()
        self._queues: dict[int, deque[ControlPayload]] = {a: deque() for a in block}
        self._errors: dict[int, AFDError] = {}
        self._receivers: list[threading.Thread] = []

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

        self._torch = torch
        self._dtype = getattr(torch, self.wire.dtype)
        self._logits_dtype = getattr(torch, self.wire.router_logits_dtype)
        self._rows = (-1, self.wire.hidden_size)
        for rank in self._queues:
            thread = threading.Thread(
                target=self._receive_control,
                args=(rank,),
                daemon=True,
                name=f"afd-control-a{rank}-f{self.role_rank}",
            )
            self._receivers.append(thread)
            thread.start()

    def _stop_protocol(self, join_timeout_s: float = 2.0) -> None:
        """Call from ``_close`` once the transport woke its waiters."""
        with self._cond:
            self._cond.notify_all()
        for thread in self._receivers:
            thread.join(join_timeout_s)
        self._receivers.clear()
        self._pending.clear()
        self._slots.clear()
        self._pool.clear()

    def _wake_waiters(self) -> None:
        with self._cond:
            self._cond.notify_all()

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
        """Remember ``exc`` (unless it is AFDShutdown): later calls raise it again."""
        if not isinstance(exc, AFDShutdown):
            self._failure = exc

    def _slot(self, key: tuple[object, ...], rows: int, with_logits: bool) -> _Slot:
        """The buffer of ``key`` sized for ``rows`` tokens (callers first try ``_slots``)."""
        wire = self.wire
        hb = hidden_nbytes(rows, wire)
        lb = logits_nbytes(rows, wire) if with_logits else 0
        nbytes = HEADER_BYTES + hb + lb
        storage = self._pool.get(key)
        if storage is None or storage.numel() < nbytes:
            storage = self._allocate(max(nbytes, 4096))
            self._pool[key] = storage
        buf = storage[:nbytes]
        hidden = buf[HEADER_BYTES : HEADER_BYTES + hb].view(self._dtype).view(self._rows)
        offset, logits = HEADER_BYTES + hb, None
        if lb and offset % self._logits_dtype.itemsize == 0:
            logits = (
                buf[offset : offset + lb]
                .view(self._logits_dtype)
                .view(-1, wire.router_logits_width)
            )
        slot = _Slot(rows, buf, hidden, logits, offset, lb)
        self._slots[key] = slot
        return slot

    def _pack_logits(self, slot: _Slot, logits: Any) -> None:
        if slot.logits is not None:
            slot.logits.copy_(logits)
        else:  # unaligned: copy the bytes
            end = slot.logits_offset + slot.logits_nbytes
            slot.buf[slot.logits_offset : end].copy_(
                logits.contiguous().view(-1).view(self._torch.uint8)
            )

    def _unpack_logits(self, slot: _Slot) -> Any:
        if slot.logits is not None:
            return slot.logits
        end = slot.logits_offset + slot.logits_nbytes
        raw = slot.buf[slot.logits_offset : end].clone()
        return raw.view(self._logits_dtype).view(-1, self.wire.router_logits_width)

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
        if self._announced is not None:
            step_id, stages = self._announced
            expected = len(stages) * self.wire.num_exchange_layers
            if self._exchanges != expected:
                exc = AFDProtocolError(
                    f"AFD: attention rank {self.role_rank} starts step {payload.step_id} after "
                    f"{self._exchanges} layer exchanges in step {step_id}, expected {expected} "
                    f"({self.wire.num_exchange_layers} layers x {len(stages)} stages); every "
                    "forward must exchange at every layer and stage"
                )
                self._fail(exc)
                raise exc
        frame = self._pool.get(("control",))
        if frame is None:
            frame = self._pool[("control",)] = self._allocate(CONTROL_FRAME_BYTES)
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
        logits. Returns once the send is posted; :meth:`recv_output` of the same stage
        completes it.
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        wire, announced, stage = self.wire, self._announced, header.stage
        width = wire.router_logits_width
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
                f"AFD: router_logits {'missing' if router_logits is None else 'given'} but "
                f"the wire spec has router_logits_width={width}; compute_gate_on_attention "
                "decides whether the attention role sends router logits"
            )
        if router_logits is not None and (
            router_logits.shape != (n, width) or router_logits.dtype != self._logits_dtype
        ):
            self._reject_rows("router_logits", router_logits, n, width, self._logits_dtype)
        key = ("a2f", stage)
        slot = self._slots.get(key)
        if slot is None or slot.rows != n:
            slot = self._slot(key, n, width > 0)
        what = (header.layer, header.step_id)
        try:
            pending = self._pending.pop(key, None)
            if pending is not None:
                self._wait(pending[0], pending[1], time.monotonic() + self._timeout_s, pending[2])
            self._write_bytes(
                slot.addr, self._headers.a2f(header.step_id, header.layer, stage, n, self.role_rank)
            )
            if n:
                slot.hidden.copy_(hidden)
                if router_logits is not None:
                    self._pack_logits(slot, router_logits)
            handle = self._post_send(slot.buf, self._ffn_world, TAG_A2F)
        except AFDError as exc:
            self._fail(exc)
            raise
        self._pending[key] = (handle, self._ffn_world, what)

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
        key = ("f2a", stage)
        slot = self._slots.get(key)
        if slot is None or slot.rows != n:
            slot = self._slot(key, n, False)
        deadline = time.monotonic() + self._timeout_s
        what = (layer, header.step_id)
        try:
            handle = self._post_recv(slot.buf, self._ffn_world, TAG_F2A)
            pending = self._pending.pop(("a2f", stage), None)
            if pending is not None:
                self._wait(pending[0], pending[1], deadline, pending[2])
            self._wait(handle, self._ffn_world, deadline, what)
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

    def _receive_control(self, rank: int) -> None:
        """Receiver thread: post a control receive from ``rank``, queue what arrives."""
        peer = self._attention_world[rank]
        frame = self._allocate(CONTROL_FRAME_BYTES)
        addr = frame.data_ptr()
        try:
            while not self.is_closed:
                handle = self._post_recv(frame, peer, TAG_CONTROL)
                self._wait(handle, peer, None, "the next control payload")
                payload = decode_control_frame(self._read_bytes(addr, CONTROL_FRAME_BYTES))
                with self._cond:
                    self._queues[rank].append(payload)
                    self._cond.notify_all()
            return
        except AFDError as exc:
            error: AFDError = exc
        except Exception as exc:
            error = self._peer_failure(peer, "the next control payload", str(exc), False)
        with self._cond:
            self._errors[rank] = error
            self._cond.notify_all()

    def _recv_step(self) -> FFNStep | None:
        if self.is_closed:
            return None
        if self._failure is not None or self._torch is None:
            self._raise_unusable()
        if self.config.role != "ffn":
            raise RuntimeError(f"{self.name}: recv_step is for the FFN role")
        with self._cond:
            while True:
                if self.is_closed:
                    return None
                ready = {r: q.popleft() for r, q in self._queues.items() if q}
                if ready:
                    break
                for error in self._errors.values():
                    if not isinstance(error, AFDShutdown):
                        self._fail(error)
                        raise error
                self._cond.wait(1.0)
        try:
            return self._assembler.assemble(ready)
        except AFDProtocolError as exc:
            self._fail(exc)
            raise

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
        with_logits = self.wire.router_logits_width > 0
        deadline = time.monotonic() + self._timeout_s
        posted = []
        try:
            for payload, rank, counts in zip(
                step.payloads, step.attention_ranks, step.tokens, strict=True
            ):
                key, n = ("a2f", rank, stage), counts[stage]
                slot = self._slots.get(key)
                if slot is None or slot.rows != n:
                    slot = self._slot(key, n, with_logits)
                peer = self._attention_world[rank]
                posted.append(
                    (self._post_recv(slot.buf, peer, TAG_A2F), peer, slot, payload.step_id, rank)
                )
            for handle, peer, slot, step_id, rank in posted:
                self._wait(handle, peer, deadline, (layer, step_id))
                raw = self._read_bytes(slot.addr, HEADER_BYTES)
                if raw != self._headers.a2f(step_id, layer, stage, slot.rows, rank):
                    check_received(
                        raw,
                        a2f_header(step_id, layer, stage, slot.rows, rank, self.wire),
                        describe_rank(self.topology, "attention", rank),
                    )
        except AFDError as exc:
            self._fail(exc)
            raise
        slots = [p[2] for p in posted]
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=self._concat(("cat", stage), [s.hidden for s in slots], self._dtype),
            router_logits=self._concat(
                ("catl", stage), [self._unpack_logits(s) for s in slots], self._logits_dtype
            )
            if with_logits
            else None,
            splits=tuple(s.rows for s in slots),
            headers=tuple(
                a2f_header(p[3], layer, stage, p[2].rows, p[4], self.wire) for p in posted
            ),
        )

    def _concat(self, key: tuple[object, ...], parts: list[Any], dtype: Any) -> Any:
        if len(parts) == 1:
            return parts[0]
        rows, cols = sum(p.shape[0] for p in parts), parts[0].shape[1]
        nbytes = rows * cols * dtype.itemsize
        storage = self._pool.get(key)
        if storage is None or storage.numel() < nbytes:
            storage = self._allocate(max(nbytes, 4096))
            self._pool[key] = storage
        out = storage[:nbytes].view(dtype).view(rows, cols)
        return self._torch.cat(parts, out=out)

    def send_output(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Split ``output`` by ``batch.splits`` and send each part to its attention rank.

        Returns once every part is sent (a closing FFN rank never drops a result).
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        splits, layer, stage = batch.splits, batch.layer, batch.stage
        if output.shape != (sum(splits), self.wire.hidden_size) or output.dtype != self._dtype:
            self._reject_rows("output", output, sum(splits), self.wire.hidden_size, self._dtype)
        deadline = time.monotonic() + self._timeout_s
        single = len(splits) == 1
        posted = []
        start = 0
        try:
            for payload, rank, n in zip(
                batch.step.payloads, batch.step.attention_ranks, splits, strict=True
            ):
                key = ("f2a", rank, stage)
                slot = self._slots.get(key)
                if slot is None or slot.rows != n:
                    slot = self._slot(key, n, False)
                self._write_bytes(
                    slot.addr, self._headers.f2a(payload.step_id, layer, stage, n, self.role_rank)
                )
                if n:
                    slot.hidden.copy_(output if single else output[start : start + n])
                peer = self._attention_world[rank]
                posted.append((self._post_send(slot.buf, peer, TAG_F2A), peer, payload.step_id))
                start += n
            for handle, peer, step_id in posted:
                self._wait(handle, peer, deadline, (layer, step_id))
        except AFDError as exc:
            self._fail(exc)
            raise
