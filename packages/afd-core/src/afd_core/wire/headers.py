"""Data headers: the one writer (:class:`HeaderWriter`) and the one check (:func:`check_header`).

Every eager data message carries, or is preceded by, a 64-byte
:class:`~afd_core.wire.metadata.TransferHeader`. Endpoints never build one: they give the
writer the direction, step, layer, stage, token count and sender rank, and it packs the
bytes (:class:`~afd_core.wire.HeaderCodec`) where the message needs them. A receiver
compares the 64 bytes it got with the 64 bytes it expects; on a difference
:func:`check_header` raises an error naming every differing field, both values, and the
sender.

Two ways to hold headers, one per kind of exchange:

* **a step's rows** (P2P: both sides know every message of a step in advance, one per
  (stage, exchange layer) and direction): the sender writes all of its headers when the
  step begins (:class:`OutgoingHeaders`), the receiver all the headers it expects
  (:class:`IncomingHeaders`), one row each (:meth:`HeaderWriter.write_stage`), so the
  per-message path only sends a row and compares 64 bytes. A host transport (gloo)
  compares each message's header as soon as it arrived, whether it came as a message of
  its own or at the start of a frame; a device transport (NCCL) receives into device
  memory and compares all received rows on the device once, when the step's last message
  has arrived (one host synchronisation per step instead of one per message);
* **one header per message** (expert-routed: the routed row count is known only when the
  layer is sent): :class:`HeaderedBuffer` is a reused send buffer whose first 64 bytes
  take the header, and the receiver checks with :meth:`HeaderWriter.expect`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.wire import HEADER_BYTES, HeaderCodec, raise_header_mismatch
from afd_core.wire.metadata import TransferHeader

if TYPE_CHECKING:
    import torch

    from afd_core.connector import WireSpec
    from afd_core.dataplane.transport import Transport


def writable_bytes(address: int, nbytes: int) -> memoryview:
    """The ``nbytes`` of host memory at ``address`` as a writable byte view (the owner of
    the memory must outlive the view)."""
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def check_header(raw: bytes, expected: bytes, sender: str) -> None:
    """Raise AFDProtocolError naming ``sender`` and every field where the received header
    ``raw`` differs from the ``expected`` one (both 64 bytes); nothing when they are equal."""
    if raw != expected:
        raise_header_mismatch(raw, TransferHeader.decode(expected), sender)


@dataclass(frozen=True, slots=True)
class MessageHeader:
    """What the header of one message says besides the wire spec's dtype and hidden size
    (the fields of :class:`~afd_core.wire.metadata.TransferHeader`)."""

    direction: str
    step_id: int
    layer: int
    stage: int
    num_tokens: int
    sender_rank: int
    logits_width: int = 0
    topk: int = 0


class HeaderWriter:
    """Writes and checks the data headers of one wire spec (see the module docstring)."""

    def __init__(self, wire: WireSpec) -> None:
        self._wire = wire
        self._pack = HeaderCodec(wire).pack_into
        self._num_tokens_of = HeaderCodec(wire).num_tokens_of
        self._expected = bytearray(HEADER_BYTES)
        self._expected_view = memoryview(self._expected)

    def write(self, view: memoryview, offset: int, header: MessageHeader) -> None:
        """Write ``header`` at ``view[offset:offset + 64]`` (the padding bytes stay as they
        are: header memory starts zeroed)."""
        h = header
        self._pack(view, offset, h.direction, h.step_id, h.layer, h.stage, h.num_tokens,
                   h.sender_rank, logits_width=h.logits_width, topk=h.topk)  # fmt: skip

    def write_stage(
        self,
        a2f: memoryview,
        f2a: memoryview,
        step_id: int,
        stage: int,
        num_tokens: int,
        attention_rank: int,
        ffn_rank: int,
    ) -> None:
        """The P2P headers of one stage of a step between one attention rank and its FFN
        rank: row ``stage * L + i`` (``L`` exchange layers, ``i`` the layer's index) of
        ``a2f`` and of ``f2a`` for every exchange layer. The attention rank writes its
        outgoing rows into ``a2f`` and the rows it expects into ``f2a``; the FFN rank the
        other way round. A2F headers carry the layer's router-logit width."""
        wire, layers, pack = self._wire, self._wire.exchange_layers, self._pack
        for i, layer in enumerate(layers):
            offset = (stage * len(layers) + i) * HEADER_BYTES
            pack(a2f, offset, "a2f", step_id, layer, stage, num_tokens, attention_rank,
                 logits_width=wire.logits_width_at(layer))  # fmt: skip
            pack(f2a, offset, "f2a", step_id, layer, stage, num_tokens, ffn_rank)

    def expect(self, raw: bytes, sender: str, header: MessageHeader) -> None:
        """:func:`check_header` of ``raw`` against ``header`` as :meth:`write` writes it."""
        self.write(self._expected_view, 0, header)
        check_header(raw, bytes(self._expected), sender)

    def num_tokens_of(self, raw: bytes) -> int:
        """The token (row) count a received header announces, unchecked: :meth:`expect`
        the whole header with it afterwards."""
        return self._num_tokens_of(raw)


class _HostRows:
    """``rows`` zeroed 64-byte rows in host memory, writable as one memoryview."""

    def __init__(self, rows: int) -> None:
        import torch

        self.rows = rows
        self.host = torch.zeros(max(rows, 1) * HEADER_BYTES, dtype=torch.uint8)
        self.addr = self.host.data_ptr()
        self.view = writable_bytes(self.addr, self.host.numel())
        self.row_tensors = list(self.host.view(-1, HEADER_BYTES).unbind(0))

    def raw(self, row: int) -> bytes:
        """The 64 bytes of ``row``."""
        return ctypes.string_at(self.addr + row * HEADER_BYTES, HEADER_BYTES)


class OutgoingHeaders:
    """The header rows one rank sends one peer in a step (see the module docstring).

    Write every row through :attr:`view` between steps, then :meth:`publish`; :meth:`row`
    is then the tensor to send as a header message, :meth:`address` where a frame copies
    its header from.
    """

    def __init__(self, transport: Transport, rows: int) -> None:
        self._transport = transport
        self._rows = _HostRows(rows)
        self._published: list[torch.Tensor] = self._rows.row_tensors

    @property
    def rows(self) -> int:
        """How many rows the block holds."""
        return self._rows.rows

    @property
    def view(self) -> memoryview:
        """The writable bytes of every row (row ``i`` at ``i * 64``)."""
        return self._rows.view

    def address(self, row: int) -> int:
        """Where the 64 bytes of row ``row`` are in host memory."""
        return self._rows.addr + row * HEADER_BYTES

    def publish(self) -> None:
        """Make the rows written so far the ones :meth:`row` sends (device: one copy)."""
        device = self._transport.to_device(self._rows.host)
        if device is self._rows.host:
            self._published = self._rows.row_tensors
        else:
            self._published = list(device.view(-1, HEADER_BYTES).unbind(0))

    def row(self, row: int) -> torch.Tensor:
        """The tensor to send as the header message of message ``row``."""
        return self._published[row]


class IncomingHeaders:
    """The header rows one rank expects from one peer in a step, and where they land.

    ``sender`` names the peer in error messages. Write the expected rows through
    :attr:`view` between steps, then :meth:`publish`; receive message ``row``'s header
    message into :meth:`row`; check with :meth:`check` (host transports, per message) or
    :meth:`check_all` (device transports, once per step). A header that came at the
    start of a frame is checked with :meth:`check_at`.
    """

    def __init__(self, transport: Transport, rows: int, sender: str) -> None:
        import torch

        self._transport = transport
        self._sender = sender
        self._expected = _HostRows(rows)
        self._on_host = transport.device.type == "cpu"
        self._received = _HostRows(rows) if self._on_host else None
        self._received_device: torch.Tensor | None = None
        self._expected_device: torch.Tensor | None = None
        self._expected_rows: list[bytes] = []
        if self._received is not None:
            self._landing = self._received.row_tensors
        else:
            self._received_device = torch.zeros(
                max(rows, 1) * HEADER_BYTES, dtype=torch.uint8, device=transport.device
            )
            self._landing = list(self._received_device.view(-1, HEADER_BYTES).unbind(0))

    @property
    def view(self) -> memoryview:
        """The writable bytes of every expected row."""
        return self._expected.view

    @property
    def checks_each_message(self) -> bool:
        """True for host memory: :meth:`check` after each message; else :meth:`check_all`."""
        return self._on_host

    def publish(self) -> None:
        """Take the expected rows written so far (host transports keep them as bytes to
        compare with; device transports copy them to the device once)."""
        if self._on_host:
            rows = ctypes.string_at(self._expected.addr, self._expected.rows * HEADER_BYTES)
            self._expected_rows = [
                rows[at : at + HEADER_BYTES] for at in range(0, len(rows), HEADER_BYTES)
            ]
        else:
            self._expected_device = self._transport.to_device(self._expected.host)

    def row(self, row: int) -> torch.Tensor:
        """The tensor that receives the header message of message ``row``."""
        return self._landing[row]

    def check(self, row: int) -> None:
        """Raise AFDProtocolError unless the received header message ``row`` is the
        expected one."""
        assert self._received is not None
        self.check_at(row, self._received.addr + row * HEADER_BYTES)

    def check_at(self, row: int, address: int) -> None:
        """Raise AFDProtocolError unless the 64 bytes at host ``address`` (a received
        header message, or the start of a received frame) are the header expected for
        ``row``."""
        check_header(ctypes.string_at(address, HEADER_BYTES), self._expected_rows[row],
                     self._sender)  # fmt: skip

    def check_all(self, rows: int) -> None:
        """Check the first ``rows`` received rows at once (device transports; synchronises
        the device)."""
        import torch

        assert self._received_device is not None and self._expected_device is not None
        n = rows * HEADER_BYTES
        received = self._received_device[:n].view(rows, HEADER_BYTES)
        expected = self._expected_device[:n].view(rows, HEADER_BYTES)
        bad = self._transport.to_host(torch.ne(received, expected).any(dim=1))
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raw = bytes(self._transport.to_host(received[row]).tolist())
            check_header(raw, self._expected.raw(row), self._sender)


def read_header(transport: Transport, message: torch.Tensor) -> bytes:
    """The first 64 bytes of a received ``message`` (a contiguous uint8 tensor on
    ``transport``'s device); synchronises for device memory."""
    host = transport.to_host(message[:HEADER_BYTES]) if message.device.type != "cpu" else message
    return ctypes.string_at(host.data_ptr(), HEADER_BYTES)


class HeaderedBuffer:
    """A send buffer of at least ``nbytes`` on ``transport``'s device, reused from message
    to message, whose first 64 bytes take a header.

    :meth:`HeaderWriter.write` the header into :attr:`header` (zeroed once, so the padding
    stays zero), then :meth:`publish_header` before posting a send of :attr:`tensor`; the
    buffer may be written again once that send is complete. In host memory the header is
    written in place; in device memory it is written on the host and copied in.
    """

    def __init__(self, transport: Transport, nbytes: int) -> None:
        import torch

        self.tensor = transport.allocate(max(nbytes, HEADER_BYTES))
        self.tensor[:HEADER_BYTES].zero_()
        self._staging: torch.Tensor | None = None
        if self.tensor.device.type == "cpu":
            address = self.tensor.data_ptr()
        else:
            self._staging = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
            address = self._staging.data_ptr()
        self.header = writable_bytes(address, HEADER_BYTES)

    @property
    def nbytes(self) -> int:
        """The buffer's size in bytes."""
        return self.tensor.numel()

    def publish_header(self) -> None:
        """Make the header written into :attr:`header` part of :attr:`tensor`."""
        if self._staging is not None:
            self.tensor[:HEADER_BYTES].copy_(self._staging)


class HeaderedBuffers:
    """One :class:`HeaderedBuffer` per key on ``transport``'s device, made at first use and
    replaced by a larger one when a message does not fit (at least 4 KiB each)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._buffers: dict[tuple[int, int], HeaderedBuffer] = {}

    def get(self, key: tuple[int, int], nbytes: int) -> HeaderedBuffer:
        """The buffer of ``key``, at least ``nbytes`` long."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = self._buffers[key] = HeaderedBuffer(self._transport, max(nbytes, 4096))
        return buffer
