"""Frames: one message holding the 64-byte header and the tensors it describes.

Layout of a frame (offsets from its start; docs/wire-protocol.md section 3):

* 0: the 64-byte :class:`~afd_core.wire.metadata.TransferHeader`;
* 64: the hidden-state rows (``rows x hidden_size`` of the wire dtype);
* ``logits_at``: the router logits (P2P A2F messages of layers that carry them): ``rows x
  width`` of the logits dtype, where ``logits_at`` is 64 plus the hidden bytes rounded up
  to a multiple of 64, so that every part of a frame can be viewed as a tensor.

A frame without logits (every F2A reply, P2P or expert-routed) is the header and the rows.

Why P2P sends frames on a host transport: on gloo every message costs the same system
calls and wake-ups of both processes whatever its size, and each small Python or torch
call between a wait and the next post costs several times its quiet-host time, because
it runs on a core the other process just left (docs/performance.md). So a P2P message of
at most :data:`FRAME_LIMIT_BYTES` is one frame (:func:`uses_frames`), and the per-layer
path between transfers is a few ``memmove`` calls on addresses worked out when the step
began. Above the limit the copies into and out of a frame cost about as much as a
header message of its own, and on a device transport (NCCL) a copy into a frame would be
a device copy per message: there the header goes as a message of its own
(:func:`~afd_core.runtime.messages.forms.headed`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.wire import DTYPE_SIZES, HEADER_BYTES

if TYPE_CHECKING:
    import torch

    from afd_core.connector import WireSpec
    from afd_core.dataplane.transport import Transport

#: Every part of a frame starts at a multiple of this many bytes.
FRAME_ALIGN = 64
#: The largest frame; a larger message is a header message and the bare tensors: on gloo
#: frames beat header messages below this size and tie with them at it (the A/B is in
#: docs/performance.md).
FRAME_LIMIT_BYTES = 1 << 20

memmove = ctypes.memmove


def _round_up(nbytes: int) -> int:
    return -(-nbytes // FRAME_ALIGN) * FRAME_ALIGN


@dataclass(frozen=True)
class FrameLayout:
    """Where the parts of a frame of ``rows`` rows are, in bytes (see the module docstring).

    ``logits_bytes`` is 0 when the wire spec has no router logits.
    """

    rows: int
    hidden_bytes: int
    logits_at: int
    logits_bytes: int

    @classmethod
    def of(cls, wire: WireSpec, rows: int, dtype: str | None = None) -> FrameLayout:
        """The layout of a frame of ``rows`` rows under ``wire``, its rows in ``dtype``
        (a wire dtype name; default the wire spec's: expert-routed replies may carry
        float32 partials)."""
        hidden_bytes = rows * wire.hidden_size * DTYPE_SIZES[dtype or wire.dtype]
        logits_bytes = rows * wire.router_logits_width * DTYPE_SIZES[wire.router_logits_dtype]
        return cls(rows, hidden_bytes, HEADER_BYTES + _round_up(hidden_bytes), logits_bytes)

    @property
    def size(self) -> int:
        """Bytes of a frame without router logits (an F2A frame, a layer without logits)."""
        return HEADER_BYTES + self.hidden_bytes

    @property
    def size_with_logits(self) -> int:
        """Bytes of a frame with router logits."""
        return self.logits_at + self.logits_bytes if self.logits_bytes else self.size


def uses_frames(transport: Transport, layout: FrameLayout) -> bool:
    """Whether messages laid out as ``layout`` travel as frames on ``transport``: on a
    host-memory transport, when a frame with router logits takes at most
    :data:`FRAME_LIMIT_BYTES` (both roles decide alike from the same token count)."""
    return transport.device.type == "cpu" and layout.size_with_logits <= FRAME_LIMIT_BYTES


class FrameBuffer:
    """A reusable host buffer that holds one frame at a time; grows, never shrinks."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def hold(self, layout: FrameLayout) -> HeldFrame:
        """The buffer laid out for ``layout`` (grown when too small); valid until the
        next :meth:`hold`."""
        import torch

        size = layout.size_with_logits
        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = torch.zeros(max(size, HEADER_BYTES), dtype=torch.uint8)
        return HeldFrame(self._buffer, layout)


class HeldFrame:
    """A frame laid out in a buffer: the exact-size tensors to send or receive (with and
    without logits), its address, and views of its parts."""

    __slots__ = ("_buffer", "address", "layout", "message", "message_with_logits")

    def __init__(self, buffer: torch.Tensor, layout: FrameLayout) -> None:
        self._buffer = buffer
        self.layout = layout
        self.address: int = buffer.data_ptr()
        self.message = buffer[: layout.size]
        self.message_with_logits = (
            buffer[: layout.size_with_logits] if layout.logits_bytes else self.message
        )

    def hidden(self, width: int, dtype: torch.dtype) -> torch.Tensor:
        """The hidden-state rows, as a ``(rows, width)`` tensor of ``dtype``."""
        return frame_rows(self._buffer, self.layout, width, dtype)

    def logits(self, width: int, dtype: torch.dtype) -> torch.Tensor:
        """The router logits, as a ``(rows, width)`` tensor of ``dtype``."""
        return self._part(self.layout.logits_at, self.layout.logits_bytes, width, dtype)

    def write_hidden(self, hidden: torch.Tensor) -> None:
        """Copy ``hidden`` (``(rows, width)`` of the layout's size, any device) into the
        hidden-state part."""
        self._write(HEADER_BYTES, self.layout.hidden_bytes, hidden)

    def write_logits(self, logits: torch.Tensor) -> None:
        """Copy ``logits`` (``(rows, width)`` of the layout's size, any device) into the
        router-logits part."""
        self._write(self.layout.logits_at, self.layout.logits_bytes, logits)

    def _write(self, at: int, nbytes: int, tensor: torch.Tensor) -> None:
        if tensor.is_cpu and tensor.is_contiguous():
            memmove(self.address + at, tensor.data_ptr(), nbytes)
        else:  # a device model on a host transport: one copy to the host, into place
            self._part(at, nbytes, tensor.shape[1], tensor.dtype).copy_(tensor)

    def _part(self, at: int, nbytes: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        return _part_of(self._buffer, at, nbytes, self.layout.rows, width, dtype)


def _part_of(
    buffer: torch.Tensor, at: int, nbytes: int, rows: int, width: int, dtype: torch.dtype
) -> torch.Tensor:
    """Bytes ``at .. at + nbytes`` of ``buffer`` as a ``(rows, width)`` tensor of ``dtype``."""
    return buffer[at : at + nbytes].view(dtype).view(rows, width)


def frame_rows(
    frame: torch.Tensor, layout: FrameLayout, width: int, dtype: torch.dtype
) -> torch.Tensor:
    """The hidden-state rows of ``frame`` (a uint8 tensor laid out as ``layout``), as a
    ``(rows, width)`` view of ``dtype``."""
    return _part_of(frame, HEADER_BYTES, layout.hidden_bytes, layout.rows, width, dtype)


class ReplyFrames:
    """The P2P reply frames of one stage at the attention rank: a new frame for every reply.

    Each reply is received into a frame of its own, and the rows of that frame become the
    caller's output (a new tensor per layer, as the endpoint contract says). The frame a
    layer will need is allocated one layer ahead, by :meth:`prepare` once the previous
    layer's messages are posted, so its allocation overlaps the round trip in flight
    instead of delaying the next send. Frames are allocated one by one, so the allocator
    recycles the memory of outputs the caller has dropped: a block of fresh memory per
    step would cost page faults during the receives instead.
    """

    def __init__(self, layout: FrameLayout, width: int, dtype: torch.dtype) -> None:
        import torch

        self.layout = layout
        self._width, self._dtype = width, dtype
        self._empty, self._bytes = torch.empty, torch.uint8  # looked up once, not per layer
        self._next: tuple[torch.Tensor, int, torch.Tensor] | None = None

    def take(self) -> tuple[torch.Tensor, int, torch.Tensor]:
        """The next reply's frame: the tensor to receive into, its host address, the
        output (a view of its rows)."""
        frame = self._next if self._next is not None else self._allocate()
        self._next = None
        return frame

    def prepare(self) -> None:
        """Allocate the frame the next :meth:`take` returns (no-op when there is one)."""
        if self._next is None:
            self._next = self._allocate()

    def _allocate(self) -> tuple[torch.Tensor, int, torch.Tensor]:
        frame = self._empty(self.layout.size, dtype=self._bytes)  # exactly the reply
        return frame, frame.data_ptr(), frame_rows(frame, self.layout, self._width, self._dtype)
