"""The CPU kernels of the ``afd_ascend`` ops: find the group by name, run the reference.

``a2e`` and ``e2a`` run :class:`~afd_ascend_ops.reference.group.ReferenceGroup` on the
group ``group_ep`` names (see :mod:`afd_ascend_ops.registry`); ``aiv_num`` (the vector
cores of the Ascend kernel) has no meaning here. The CAM async ops run
:class:`~afd_ascend_ops.reference.async_group.AsyncGroup` on the group ``group_name``
names; ``comm_args`` and ``comm_id`` (the compiled kernels' communication arguments) have
no meaning here either.

Each function takes its op's arguments as one record (:mod:`afd_ascend_ops.schemas`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from afd_ascend_ops import registry
from afd_ascend_ops.reference.async_group import AsyncGroup, AsyncWorld
from afd_ascend_ops.reference.group import ReferenceGroup
from afd_ascend_ops.schemas import A2E, E2A, CombineRecv, CombineSend, DispatchRecv, DispatchSend


def a2e(a: A2E) -> list[torch.Tensor]:
    """``afd_ascend::a2e`` on CPU tensors (see the README for the semantics)."""
    return registry.lookup(a.group_ep, ReferenceGroup).a2e(
        a.x, a.expert_ids, a.scales, a.batch_size, a.hidden_size, a.topk, a.expert_rank_size,
        a.attention_rank_size, a.rank, a.compute_gate,
    )  # fmt: skip


def e2a(a: E2A) -> torch.Tensor:
    """``afd_ascend::e2a`` on CPU tensors (see the README for the semantics)."""
    return registry.lookup(a.group_ep, ReferenceGroup).e2a(
        a.expand_x, a.atten_batch_size, a.batch_size, a.hidden_size, a.topk, a.expert_rank_size,
        a.attention_rank_size, a.rank,
    )  # fmt: skip


def dispatch_send(a: DispatchSend) -> torch.Tensor:
    """``afd_ascend::afd_async_dispatch_send`` on CPU tensors (see the README)."""
    world = AsyncWorld(a.moe_rank_num, a.attn_rank_num, a.route_expert_num_per_moe,
                       a.attn_rank_id, a.world_size, a.tp_size)  # fmt: skip
    return registry.lookup(a.group_name, AsyncGroup).dispatch_send(
        a.x, a.expert_ids, world, a.max_seq_len, a.batch_size, a.hidden_size, a.top_k,
        a.layer_index, a.dynamic_quant,
    )  # fmt: skip


def dispatch_recv(a: DispatchRecv) -> list[torch.Tensor]:
    """``afd_ascend::afd_async_dispatch_recv`` on CPU tensors (see the README)."""
    return registry.lookup(a.group_name, AsyncGroup).dispatch_recv(
        a.x, ffn_world(a), a.max_seq_len, a.hidden_size, a.top_k, a.dynamic_quant
    )


def combine_send(a: CombineSend) -> torch.Tensor:
    """``afd_ascend::afd_async_combine_send`` on CPU tensors (see the README)."""
    return registry.lookup(a.group_name, AsyncGroup).combine_send(
        a.expand_x, a.batch_info, ffn_world(a), a.hidden_size
    )


def combine_recv(a: CombineRecv) -> torch.Tensor:
    """``afd_ascend::afd_async_combine_recv`` on CPU tensors (see the README)."""
    world = AsyncWorld(a.moe_rank_num, a.attn_rank_num, a.route_expert_num_per_moe,
                       a.attn_rank_id, a.world_size, 1)  # fmt: skip
    return registry.lookup(a.group_name, AsyncGroup).combine_recv(
        a.expand_x, a.expert_ids, a.expert_scales, world, a.batch_size, a.hidden_size, a.top_k
    )


def ffn_world(a: DispatchRecv | CombineSend) -> AsyncWorld:
    """An FFN rank's world arguments, its ``moe_rank_id`` (attention-first numbering)
    turned into its FFN rank."""
    return AsyncWorld(
        a.moe_rank_num, a.attn_rank_num, a.route_expert_num_per_moe,
        a.moe_rank_id - a.attn_rank_num, a.world_size, a.tp_size,
    )  # fmt: skip


#: The CPU kernel of each op, by op name.
KERNELS: dict[str, Callable[[Any], Any]] = {
    A2E.OP: a2e,
    E2A.OP: e2a,
    DispatchSend.OP: dispatch_send,
    DispatchRecv.OP: dispatch_recv,
    CombineSend.OP: combine_send,
    CombineRecv.OP: combine_recv,
}
