"""Reusable message buffers of a P2P connector, with typed views of their sections.

A message (see :mod:`afd_core.connectors.p2p_wire`) is one uint8 buffer: header, hidden
states, router logits. Each (direction, peer, stage) key owns one storage tensor that
grows to the largest message seen, so the number of buffers is bounded by the topology;
a :class:`Slot` caches the sliced buffer and its typed views for one token count, so the
per-layer path does no tensor slicing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from afd_core.connectors.p2p_wire import HEADER_BYTES, hidden_nbytes, logits_nbytes

if TYPE_CHECKING:
    import torch

    from afd_core.connector import WireSpec

Key = tuple[object, ...]


class Slot:
    """The buffer of one key sized for ``rows`` tokens, and views of its sections.

    ``logits`` is None when the message has no router logits or when they are not
    aligned for their dtype (then :meth:`MessageBuffers.pack_logits` copies bytes).
    """

    __slots__ = ("addr", "buf", "hidden", "logits", "logits_nbytes", "logits_offset", "rows")

    def __init__(
        self, rows: int, buf: Any, hidden: Any, logits: Any, offset: int, nbytes: int
    ) -> None:
        self.rows, self.buf, self.addr = rows, buf, buf.data_ptr()
        self.hidden, self.logits = hidden, logits
        self.logits_offset, self.logits_nbytes = offset, nbytes


class MessageBuffers:
    """The buffers of one connector; ``allocate(nbytes)`` makes a uint8 tensor.

    Hot path: look ``slots.get(key)`` up first and call :meth:`slot` only when it is
    missing or sized for another token count.
    """

    def __init__(self, wire: WireSpec, allocate: Callable[[int], torch.Tensor]) -> None:
        import torch

        self._torch = torch
        self._wire = wire
        self._allocate = allocate
        self.dtype = getattr(torch, wire.dtype)
        self.logits_dtype = getattr(torch, wire.router_logits_dtype)
        self.slots: dict[Key, Slot] = {}
        self._storage: dict[Key, Any] = {}

    def storage(self, key: Key, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` bytes of ``key``'s storage (grown when too small)."""
        storage = self._storage.get(key)
        if storage is None or storage.numel() < nbytes:
            storage = self._allocate(max(nbytes, 4096))
            self._storage[key] = storage
        return storage[:nbytes]

    def slot(self, key: Key, rows: int, with_logits: bool) -> Slot:
        """A new slot of ``key`` for ``rows`` tokens (replaces the cached one)."""
        wire = self._wire
        hb = hidden_nbytes(rows, wire)
        lb = logits_nbytes(rows, wire) if with_logits else 0
        buf = self.storage(key, HEADER_BYTES + hb + lb)
        hidden = buf[HEADER_BYTES : HEADER_BYTES + hb].view(self.dtype).view(-1, wire.hidden_size)
        offset, logits = HEADER_BYTES + hb, None
        if lb and offset % self.logits_dtype.itemsize == 0:
            logits = (
                buf[offset : offset + lb].view(self.logits_dtype).view(-1, wire.router_logits_width)
            )
        slot = Slot(rows, buf, hidden, logits, offset, lb)
        self.slots[key] = slot
        return slot

    def pack_logits(self, slot: Slot, logits: torch.Tensor) -> None:
        """Copy ``logits`` into the logits section of ``slot``."""
        if slot.logits is not None:
            slot.logits.copy_(logits)
        else:  # unaligned: copy the bytes
            end = slot.logits_offset + slot.logits_nbytes
            raw = logits.contiguous().view(-1).view(self._torch.uint8)
            slot.buf[slot.logits_offset : end].copy_(raw)

    def unpack_logits(self, slot: Slot) -> torch.Tensor:
        """The logits section of ``slot`` as ``(rows, width)`` (a copy when unaligned)."""
        if slot.logits is not None:
            return slot.logits
        end = slot.logits_offset + slot.logits_nbytes
        raw = slot.buf[slot.logits_offset : end].clone()
        return raw.view(self.logits_dtype).view(-1, self._wire.router_logits_width)

    def concat(self, key: Key, parts: list[torch.Tensor], dtype: Any) -> torch.Tensor:
        """``parts`` stacked along tokens into ``key``'s storage; one part: itself."""
        if len(parts) == 1:
            return parts[0]
        rows, cols = sum(p.shape[0] for p in parts), parts[0].shape[1]
        out = self.storage(key, rows * cols * dtype.itemsize).view(dtype).view(rows, cols)
        return self._torch.cat(parts, out=out)

    def clear(self) -> None:
        """Drop every buffer."""
        self.slots.clear()
        self._storage.clear()
