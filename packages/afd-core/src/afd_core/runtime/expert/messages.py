"""The messages of the expert-routed exchange: bodies, reply frames and header buffers.

* **Body** of an attention-to-FFN message, one per (attention rank, FFN rank, layer,
  stage) with at least one routed row: the rows' hidden states (wire dtype), then their
  top-k expert ids (int32, global), then their top-k weights (float32), each
  ``[rows, ...]`` and contiguous. The row count comes from the header before it, so both
  sides compute every offset. The hidden part ends on a 4-byte boundary for any row
  count when ``hidden_size * dtype size`` is a multiple of 4, which
  :func:`check_packable` requires.
* **Reply frame** of an FFN rank to one attention rank: the 64-byte header, then the
  partial result of the rows routed there (wire dtype, ``[rows, hidden]``), one message
  of :func:`reply_bytes`. Both sides know the row count (the attention rank routed the
  rows, the FFN rank read it in their header), so the size is exact on every transport.
* :class:`HeaderedBuffer`: a reused send buffer whose first 64 bytes take a header,
  written in place (host memory) or copied in (device memory); :class:`HeaderedBuffers`
  keeps one per key, grown when a message does not fit.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from afd_core.errors import AFDConfigError
from afd_core.wire import DTYPE_SIZES, HEADER_BYTES

if TYPE_CHECKING:
    import torch

    from afd_core.connector import WireSpec
    from afd_core.transport import Transport


def check_packable(wire: WireSpec) -> None:
    """Raise AFDConfigError when ``wire`` cannot be routed to experts."""
    if wire.num_experts < 1 or wire.top_k < 1:
        raise AFDConfigError(
            f"AFD: the model has {wire.num_experts} routed experts and top-k {wire.top_k}; "
            "an expert-routed connector needs an MoE model"
        )
    if wire.hidden_size * DTYPE_SIZES[wire.dtype] % 4:
        raise AFDConfigError(
            f"AFD: hidden size {wire.hidden_size} in {wire.dtype} does not pack on 4-byte "
            "boundaries; the expert-routed connector needs an even hidden size"
        )


def body_bytes(rows: int, wire: WireSpec) -> int:
    """Bytes of the body of ``rows`` routed rows."""
    return rows * (wire.hidden_size * DTYPE_SIZES[wire.dtype] + wire.top_k * 8)


def _sections(
    body: torch.Tensor, rows: int, wire: WireSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    dtype = getattr(torch, wire.dtype)
    hidden_end = rows * wire.hidden_size * DTYPE_SIZES[wire.dtype]
    ids_end = hidden_end + rows * wire.top_k * 4
    return (
        body[:hidden_end].view(dtype).view(rows, wire.hidden_size),
        body[hidden_end:ids_end].view(torch.int32).view(rows, wire.top_k),
        body[ids_end : ids_end + rows * wire.top_k * 4].view(torch.float32).view(rows, wire.top_k),
    )


def pack_body(
    body: torch.Tensor,
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    rows: torch.Tensor,
    wire: WireSpec,
) -> None:
    """Gather ``rows`` of the three tensors into ``body`` (exactly :func:`body_bytes` long)."""
    import torch

    hidden_part, ids_part, weights_part = _sections(body, rows.numel(), wire)
    torch.index_select(hidden, 0, rows, out=hidden_part)
    torch.index_select(topk_ids.to(torch.int32), 0, rows, out=ids_part)
    torch.index_select(topk_weights.float(), 0, rows, out=weights_part)


def unpack_body(
    body: torch.Tensor, rows: int, wire: WireSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views ``(hidden, topk_ids, topk_weights)`` of a body of ``rows`` rows."""
    return _sections(body, rows, wire)


def reply_bytes(rows: int, wire: WireSpec) -> int:
    """Bytes of the reply frame of ``rows`` routed rows (header and partial result)."""
    return HEADER_BYTES + rows * wire.hidden_size * DTYPE_SIZES[wire.dtype]


def reply_partial(frame: torch.Tensor, rows: int, wire: WireSpec) -> torch.Tensor:
    """The partial result in a reply frame of ``rows`` rows, as a ``[rows, hidden]`` view."""
    import torch

    dtype = getattr(torch, wire.dtype)
    return frame[HEADER_BYTES : reply_bytes(rows, wire)].view(dtype).view(rows, wire.hidden_size)


def read_header(transport: Transport, message: torch.Tensor) -> bytes:
    """The first 64 bytes of ``message`` (a contiguous uint8 tensor on ``transport``'s
    device); synchronises for device memory."""
    host = transport.to_host(message[:HEADER_BYTES]) if message.device.type != "cpu" else message
    return ctypes.string_at(host.data_ptr(), HEADER_BYTES)


class HeaderedBuffer:
    """A send buffer of at least ``nbytes`` on ``transport``'s device, reused from layer
    to layer, whose first 64 bytes take a header.

    Pack the header into :attr:`header` (zeroed once, so the padding stays zero), then
    :meth:`publish_header` before posting a send of :attr:`tensor`; the buffer may be
    written again once that send is complete. In host memory the header is written in
    place; in device memory it is packed on the host and copied in.
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
        self.header = memoryview((ctypes.c_char * HEADER_BYTES).from_address(address)).cast("B")

    @property
    def nbytes(self) -> int:
        """The buffer's size in bytes."""
        return self.tensor.numel()

    def publish_header(self) -> None:
        """Make the header packed into :attr:`header` part of :attr:`tensor`."""
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
