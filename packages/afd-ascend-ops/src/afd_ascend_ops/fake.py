"""Fake (meta) kernels of the ``afd_ascend`` ops: output shapes and dtypes, no data.

What ``torch.compile`` and ``FakeTensorMode`` see, and what every real kernel (the CPU
reference, the compiled Ascend one) must return. ``F`` is ``expert_rank_size``, ``A``
``attention_rank_size``, world ranks are FFN first (``rank < F`` is an FFN rank):

=================  ==================================================================
``a2e`` on FFN     ``expand_x [batch_size, H]`` (dtype of ``x``), ``expert_ids
                   [batch_size, topk] int32`` and ``scales [batch_size, topk] float32``
                   when ``compute_gate`` (``[1, 1]`` otherwise), ``atten_batch_size
                   [ceil(A/F)] int32``, ``x_active_mask [batch_size] bool``
``a2e`` attention  ``[1, 1]`` (dtype of ``x``), ``[1, 1] int32``, ``[1, 1] float32``,
                   ``[ceil(A/F)] int32``, ``[1] bool``
``e2a`` on FFN     ``[1, 1]`` (dtype of ``expand_x``)
``e2a`` attention  ``[expand_x.shape[0], H]`` (dtype of ``expand_x``)
=================  ==================================================================

The CAM async ops: both sends return ``[1] int8``; dispatch recv returns ``expanded
[capacity, H]`` (int8 when ``dynamic_quant``, else the dtype of ``x``), ``scales
[capacity or 1] float32``, ``batch_info [5 + tp + epr * tp] int64`` and ``counts [epr]
int64`` (see :func:`~afd_ascend_ops.schemas.dispatch_capacity`); combine recv returns
``[batch_size, H]`` (dtype of ``expand_x``).

Every function repeats its schema's defaults: the dispatcher drops trailing arguments
equal to their defaults before calling a Python kernel.
"""

from __future__ import annotations

import torch

from afd_ascend_ops.schemas import batch_info_size, blocks_per_ffn_rank, dispatch_capacity


def a2e(
    x: torch.Tensor,
    expert_ids: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    batch_size: int = 0,
    hidden_size: int = 0,
    topk: int = 0,
    expert_rank_size: int = 0,
    attention_rank_size: int = 0,
    rank: int = 0,
    group_ep: str = "",
    aiv_num: int = 0,
    compute_gate: int = 0,
) -> list[torch.Tensor]:
    """Shapes of ``a2e`` (see the module docstring)."""
    blocks = blocks_per_ffn_rank(attention_rank_size, expert_rank_size)
    counts = x.new_empty(blocks, dtype=torch.int32)
    if rank >= expert_rank_size:
        return [
            x.new_empty((1, 1)),
            x.new_empty((1, 1), dtype=torch.int32),
            x.new_empty((1, 1), dtype=torch.float32),
            counts,
            x.new_empty(1, dtype=torch.bool),
        ]
    routing = (batch_size, topk) if compute_gate else (1, 1)
    return [
        x.new_empty((batch_size, hidden_size)),
        x.new_empty(routing, dtype=torch.int32),
        x.new_empty(routing, dtype=torch.float32),
        counts,
        x.new_empty(batch_size, dtype=torch.bool),
    ]


def e2a(
    expand_x: torch.Tensor,
    atten_batch_size: torch.Tensor,
    batch_size: int = 0,
    hidden_size: int = 0,
    topk: int = 0,
    expert_rank_size: int = 0,
    attention_rank_size: int = 0,
    rank: int = 0,
    group_ep: str = "",
    aiv_num: int = 0,
) -> torch.Tensor:
    """Shape of ``e2a`` (see the module docstring)."""
    blocks_per_ffn_rank(attention_rank_size, expert_rank_size)
    if rank < expert_rank_size:
        return expand_x.new_empty((1, 1))
    return expand_x.new_empty((expand_x.shape[0], hidden_size))


def dispatch_send(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    comm_args: torch.Tensor,
    comm_id: int,
    max_seq_len: int,
    batch_size: int,
    hidden_size: int,
    top_k: int,
    moe_rank_num: int,
    attn_rank_num: int,
    route_expert_num_per_moe: int,
    attn_rank_id: int,
    world_size: int,
    layer_index: int,
    tp_size: int,
    dynamic_quant: int,
    group_name: str,
) -> torch.Tensor:
    """``[1] int8``: a send's only output orders later work after it."""
    return x.new_empty(1, dtype=torch.int8)


def dispatch_recv(
    x: torch.Tensor,
    comm_args: torch.Tensor,
    comm_id: int,
    max_seq_len: int,
    hidden_size: int,
    top_k: int,
    moe_rank_num: int,
    attn_rank_num: int,
    route_expert_num_per_moe: int,
    moe_rank_id: int,
    world_size: int,
    tp_size: int,
    dynamic_quant: int,
    group_name: str,
) -> list[torch.Tensor]:
    """Shapes of ``afd_async_dispatch_recv`` (see the module docstring)."""
    capacity = dispatch_capacity(max_seq_len, top_k, route_expert_num_per_moe)
    return [
        x.new_empty((capacity, hidden_size), dtype=torch.int8 if dynamic_quant else x.dtype),
        x.new_empty(capacity if dynamic_quant else 1, dtype=torch.float32),
        x.new_empty(batch_info_size(tp_size, route_expert_num_per_moe), dtype=torch.int64),
        x.new_empty(route_expert_num_per_moe, dtype=torch.int64),
    ]


def combine_send(
    expand_x: torch.Tensor,
    comm_args: torch.Tensor,
    batch_info: torch.Tensor,
    comm_id: int,
    max_seq_len: int,
    hidden_size: int,
    top_k: int,
    moe_rank_num: int,
    attn_rank_num: int,
    route_expert_num_per_moe: int,
    moe_rank_id: int,
    world_size: int,
    tp_size: int,
    group_name: str,
) -> torch.Tensor:
    """``[1] int8``: a send's only output orders later work after it."""
    return expand_x.new_empty(1, dtype=torch.int8)


def combine_recv(
    expand_x: torch.Tensor,
    expert_ids: torch.Tensor,
    expert_scales: torch.Tensor,
    comm_args: torch.Tensor,
    comm_id: int,
    batch_size: int,
    hidden_size: int,
    top_k: int,
    moe_rank_num: int,
    attn_rank_num: int,
    route_expert_num_per_moe: int,
    attn_rank_id: int,
    world_size: int,
    group_name: str,
) -> torch.Tensor:
    """``[batch_size, H]`` in the dtype of ``expand_x`` (the combined tokens)."""
    return expand_x.new_empty((batch_size, hidden_size))


#: The fake kernel of each op, by op name.
FAKES = {
    "a2e": a2e,
    "e2a": e2a,
    "afd_async_dispatch_send": dispatch_send,
    "afd_async_dispatch_recv": dispatch_recv,
    "afd_async_combine_send": combine_send,
    "afd_async_combine_recv": combine_recv,
}
