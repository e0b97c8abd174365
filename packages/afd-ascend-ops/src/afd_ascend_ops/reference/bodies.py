"""The bodies of the reference messages: rows and routing as bytes, dtypes on the wire.

Rows travel as the bytes of a private contiguous copy (the caller may change its tensor
while the send is pending); with ``compute_gate`` the routing of those rows travels as a
second body, each row's int32 expert ids then its float32 scales. Receives land straight
in the output tensors.
"""

from __future__ import annotations

import torch

from afd_core.wire.metadata import WIRE_DTYPES

#: torch dtypes the kernels move, by their :data:`~afd_core.wire.metadata.WIRE_DTYPES` name.
WIRE_TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
}
assert set(WIRE_TORCH_DTYPES.values()) == set(WIRE_DTYPES)
TORCH_DTYPES = {name: dtype for dtype, name in WIRE_TORCH_DTYPES.items()}
#: Bytes of one routing entry on the wire: an int32 expert id and a float32 scale.
ROUTING_ENTRY_BYTES = 8


def rows_as_bytes(rows: torch.Tensor) -> torch.Tensor:
    """A private contiguous copy of ``rows`` as bytes (``[n, H * itemsize]``): the caller
    may change ``rows`` while the send is pending."""
    return rows.detach().clone(memory_format=torch.contiguous_format).view(torch.uint8)


def routing_as_bytes(
    expert_ids: torch.Tensor | None, scales: torch.Tensor | None, rows: int, topk: int, name: str
) -> torch.Tensor:
    """Expert ids (int32) and scales (float32) of ``rows`` tokens as one byte message."""
    expected = (("expert_ids", expert_ids, torch.int32), ("scales", scales, torch.float32))
    for label, tensor, dtype in expected:
        if tensor is None or tensor.dtype != dtype or list(tensor.shape) != [rows, topk]:
            got = "None" if tensor is None else f"{tensor.dtype} {list(tensor.shape)}"
            raise ValueError(
                f"afd_ascend::a2e on group {name!r}: with compute_gate=1, {label} must be "
                f"{dtype} [{rows}, {topk}], not {got}"
            )
    assert expert_ids is not None and scales is not None
    ids = expert_ids.detach().contiguous().view(torch.uint8)
    weights = scales.detach().contiguous().view(torch.uint8)
    return torch.cat([ids, weights], dim=1)


def routing_from_bytes(
    routing: torch.Tensor, rows: int, topk: int, gated: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FFN's ``expert_ids``/``scales`` outputs: the received routing, or ``[1, 1]``
    zeros when the attention side does not gate."""
    if not gated:
        return torch.zeros((1, 1), dtype=torch.int32), torch.zeros((1, 1), dtype=torch.float32)
    half = topk * ROUTING_ENTRY_BYTES // 2
    ids = routing[:, :half].contiguous().view(torch.int32)
    weights = routing[:, half:].contiguous().view(torch.float32)
    return ids.reshape(rows, topk), weights.reshape(rows, topk)
