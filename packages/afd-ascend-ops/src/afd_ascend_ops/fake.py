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

Each function takes its op's arguments as one record (:mod:`afd_ascend_ops.schemas`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from afd_ascend_ops.schemas import (
    A2E,
    E2A,
    CombineRecv,
    CombineSend,
    DispatchRecv,
    DispatchSend,
    batch_info_size,
    blocks_per_ffn_rank,
    dispatch_capacity,
)


def a2e(a: A2E) -> list[torch.Tensor]:
    """Shapes of ``a2e`` (see the module docstring)."""
    x = a.x
    counts = x.new_empty(blocks_per_ffn_rank(a.attention_rank_size, a.expert_rank_size),
                         dtype=torch.int32)  # fmt: skip
    if a.rank >= a.expert_rank_size:
        return [
            x.new_empty((1, 1)),
            x.new_empty((1, 1), dtype=torch.int32),
            x.new_empty((1, 1), dtype=torch.float32),
            counts,
            x.new_empty(1, dtype=torch.bool),
        ]
    routing = (a.batch_size, a.topk) if a.compute_gate else (1, 1)
    return [
        x.new_empty((a.batch_size, a.hidden_size)),
        x.new_empty(routing, dtype=torch.int32),
        x.new_empty(routing, dtype=torch.float32),
        counts,
        x.new_empty(a.batch_size, dtype=torch.bool),
    ]


def e2a(a: E2A) -> torch.Tensor:
    """Shape of ``e2a`` (see the module docstring)."""
    blocks_per_ffn_rank(a.attention_rank_size, a.expert_rank_size)
    if a.rank < a.expert_rank_size:
        return a.expand_x.new_empty((1, 1))
    return a.expand_x.new_empty((a.expand_x.shape[0], a.hidden_size))


def dispatch_send(a: DispatchSend) -> torch.Tensor:
    """``[1] int8``: a send's only output orders later work after it."""
    return a.x.new_empty(1, dtype=torch.int8)


def dispatch_recv(a: DispatchRecv) -> list[torch.Tensor]:
    """Shapes of ``afd_async_dispatch_recv`` (see the module docstring)."""
    x = a.x
    capacity = dispatch_capacity(a.max_seq_len, a.top_k, a.route_expert_num_per_moe)
    return [
        x.new_empty((capacity, a.hidden_size), dtype=torch.int8 if a.dynamic_quant else x.dtype),
        x.new_empty(capacity if a.dynamic_quant else 1, dtype=torch.float32),
        x.new_empty(batch_info_size(a.tp_size, a.route_expert_num_per_moe), dtype=torch.int64),
        x.new_empty(a.route_expert_num_per_moe, dtype=torch.int64),
    ]


def combine_send(a: CombineSend) -> torch.Tensor:
    """``[1] int8``: a send's only output orders later work after it."""
    return a.expand_x.new_empty(1, dtype=torch.int8)


def combine_recv(a: CombineRecv) -> torch.Tensor:
    """``[batch_size, H]`` in the dtype of ``expand_x`` (the combined tokens)."""
    return a.expand_x.new_empty((a.batch_size, a.hidden_size))


#: The fake kernel of each op, by op name.
FAKES: dict[str, Callable[[Any], Any]] = {
    A2E.OP: a2e,
    E2A.OP: e2a,
    DispatchSend.OP: dispatch_send,
    DispatchRecv.OP: dispatch_recv,
    CombineSend.OP: combine_send,
    CombineRecv.OP: combine_recv,
}
