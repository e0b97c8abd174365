"""The headers of one step's messages with one peer: written once per step, checked per message.

In a step both sides know every message in advance: one per (stage, exchange layer) and
direction. So the sender writes all of its headers when the step begins
(:class:`OutgoingHeaders`) and the receiver writes all the headers it expects
(:class:`IncomingHeaders`), one 64-byte row each, in host memory. Per message the hot
path only sends a row and, after the wait, compares 64 bytes.

A host transport (gloo) compares each message's header as soon as it arrived, whether
the header came inside the message's frame (:mod:`afd_core.runtime.p2p.frames`: the sender
copies its row from :meth:`OutgoingHeaders.address`, the receiver checks with
:meth:`IncomingHeaders.check_frame`) or as a message of its own. A device transport
(NCCL) sends from and receives into device memory: the outgoing rows go to the device in
one copy per step, and the received rows are compared with the expected ones on the
device, once, when the step's last message has arrived (one host synchronisation per
step instead of one per message).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from afd_core.metadata import TransferHeader
from afd_core.transport import Transport
from afd_core.wire import HEADER_BYTES, raise_header_mismatch

if TYPE_CHECKING:
    import torch


class _HostRows:
    """``rows`` zeroed 64-byte rows in host memory, writable as one memoryview."""

    def __init__(self, rows: int) -> None:
        import torch

        self.rows = rows
        self.host = torch.zeros(max(rows, 1) * HEADER_BYTES, dtype=torch.uint8)
        self.addr = self.host.data_ptr()
        self.view = memoryview((ctypes.c_char * self.host.numel()).from_address(self.addr)).cast(
            "B"
        )
        self.row_tensors = list(self.host.view(-1, HEADER_BYTES).unbind(0))

    def raw(self, row: int) -> bytes:
        """The 64 bytes of ``row``."""
        return ctypes.string_at(self.addr + row * HEADER_BYTES, HEADER_BYTES)


class OutgoingHeaders:
    """The header rows one rank sends one peer in a step (see the module docstring).

    Write every row with ``view``/``pack_into`` between :meth:`begin` and :meth:`publish`;
    :meth:`row` is then the tensor to send for a message.
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
        """Where the 64 bytes of row ``row`` are in host memory (a frame copies them)."""
        return self._rows.addr + row * HEADER_BYTES

    def publish(self) -> None:
        """Make the rows written so far the ones :meth:`row` sends (device: one copy)."""
        device = self._transport.to_device(self._rows.host)
        if device is self._rows.host:
            self._published = self._rows.row_tensors
        else:
            self._published = list(device.view(-1, HEADER_BYTES).unbind(0))

    def row(self, row: int) -> torch.Tensor:
        """The tensor to send as the header of message ``row``."""
        return self._published[row]


class IncomingHeaders:
    """The header rows one rank expects from one peer in a step, and where they land.

    ``sender`` names the peer in error messages. Write the expected rows through
    :attr:`view` between steps, then :meth:`publish`; receive message ``row``'s header
    into :meth:`row`; check with :meth:`check` (host transports, per message) or
    :meth:`check_all` (device transports, once per step). A header that came in a frame
    is checked with :meth:`check_frame`.
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
        self._landing: list[torch.Tensor] = []
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
        """The tensor that receives the header of message ``row``."""
        return self._landing[row]

    def check(self, row: int) -> None:
        """Raise AFDProtocolError unless the received header ``row`` is the expected one."""
        assert self._received is not None
        self.check_frame(row, self._received.addr + row * HEADER_BYTES)

    def check_frame(self, row: int, address: int) -> None:
        """Raise AFDProtocolError unless the 64 bytes at host ``address`` (a received
        header, or the start of a received frame) are the header expected for ``row``."""
        raw = ctypes.string_at(address, HEADER_BYTES)
        if raw != self._expected_rows[row]:
            expected = TransferHeader.decode(self._expected.raw(row))
            raise_header_mismatch(raw, expected, self._sender)

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
            raise_header_mismatch(raw, TransferHeader.decode(self._expected.raw(row)), self._sender)
