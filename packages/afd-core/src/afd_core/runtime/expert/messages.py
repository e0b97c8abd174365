"""The body of an expert-routed attention-to-FFN message (the message forms and headers
are :mod:`afd_core.runtime.messages`).

One body per (attention rank, FFN rank, layer, stage) with at least one routed row: the
rows' hidden states (wire dtype), then their top-k expert ids (int32, global), then
their top-k weights (float32), each ``[rows, ...]`` and contiguous. The row count comes
from the header before it, so both sides compute every offset. The hidden part ends on a
4-byte boundary for any row count when ``hidden_size * dtype size`` is a multiple of 4,
which :func:`check_packable` requires.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from afd_core.errors import AFDConfigError
from afd_core.wire import DTYPE_SIZES

if TYPE_CHECKING:
    import torch

    from afd_core.connector import WireSpec


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
