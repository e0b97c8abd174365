"""The CPU kernels of the ``afd_ascend`` ops: find the group by name, run the reference.

``a2e`` and ``e2a`` run :class:`~afd_ascend_ops.reference.group.ReferenceGroup` on the
group ``group_ep`` names (see :mod:`afd_ascend_ops.registry`); ``aiv_num`` (the vector
cores of the Ascend kernel) has no meaning here. The CAM async ops run
:class:`~afd_ascend_ops.reference.async_group.AsyncGroup` on the group ``group_name``
names; ``comm_args`` and ``comm_id`` (the compiled kernels' communication arguments) have
no meaning here either.

Every function repeats its schema's defaults: the dispatcher drops trailing arguments
equal to their defaults before calling a Python kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from afd_ascend_ops import registry
from afd_ascend_ops.reference.async_group import AsyncGroup, AsyncWorld
from afd_ascend_ops.reference.group import ReferenceGroup


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
    """``afd_ascend::a2e`` on CPU tensors (see the README for the semantics)."""
    return registry.lookup(group_ep, ReferenceGroup).a2e(
        x, expert_ids, scales, batch_size, hidden_size, topk, expert_rank_size,
        attention_rank_size, rank, compute_gate,
    )  # fmt: skip


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
    """``afd_ascend::e2a`` on CPU tensors (see the README for the semantics)."""
    return registry.lookup(group_ep, ReferenceGroup).e2a(
        expand_x, atten_batch_size, batch_size, hidden_size, topk, expert_rank_size,
        attention_rank_size, rank,
    )  # fmt: skip


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
    """``afd_ascend::afd_async_dispatch_send`` on CPU tensors (see the README)."""
    world = AsyncWorld(
        moe_rank_num, attn_rank_num, route_expert_num_per_moe, attn_rank_id, world_size, tp_size
    )
    return registry.lookup(group_name, AsyncGroup).dispatch_send(
        x, expert_ids, world, max_seq_len, batch_size, hidden_size, top_k, layer_index,
        dynamic_quant,
    )  # fmt: skip


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
    """``afd_ascend::afd_async_dispatch_recv`` on CPU tensors (see the README)."""
    world = ffn_world(
        moe_rank_num, attn_rank_num, route_expert_num_per_moe, moe_rank_id, world_size, tp_size
    )
    return registry.lookup(group_name, AsyncGroup).dispatch_recv(
        x, world, max_seq_len, hidden_size, top_k, dynamic_quant
    )


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
    """``afd_ascend::afd_async_combine_send`` on CPU tensors (see the README)."""
    world = ffn_world(
        moe_rank_num, attn_rank_num, route_expert_num_per_moe, moe_rank_id, world_size, tp_size
    )
    return registry.lookup(group_name, AsyncGroup).combine_send(
        expand_x, batch_info, world, hidden_size
    )


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
    """``afd_ascend::afd_async_combine_recv`` on CPU tensors (see the README)."""
    world = AsyncWorld(moe_rank_num, attn_rank_num, route_expert_num_per_moe, attn_rank_id,
                       world_size, 1)  # fmt: skip
    return registry.lookup(group_name, AsyncGroup).combine_recv(
        expand_x, expert_ids, expert_scales, world, batch_size, hidden_size, top_k
    )


def ffn_world(
    moe_rank_num: int,
    attn_rank_num: int,
    route_expert_num_per_moe: int,
    moe_rank_id: int,
    world_size: int,
    tp_size: int,
) -> AsyncWorld:
    """An FFN rank's world arguments, its ``moe_rank_id`` (attention-first numbering)
    turned into its FFN rank."""
    return AsyncWorld(
        moe_rank_num, attn_rank_num, route_expert_num_per_moe, moe_rank_id - attn_rank_num,
        world_size, tp_size,
    )  # fmt: skip


#: The CPU kernel of each op, by op name.
KERNELS: dict[str, Callable[..., Any]] = {
    "a2e": a2e,
    "e2a": e2a,
    "afd_async_dispatch_send": dispatch_send,
    "afd_async_dispatch_recv": dispatch_recv,
    "afd_async_combine_send": combine_send,
    "afd_async_combine_recv": combine_recv,
}
