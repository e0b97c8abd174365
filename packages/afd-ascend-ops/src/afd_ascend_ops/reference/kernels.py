"""The CPU kernels of the ``afd_ascend`` ops: find the group by name, run the reference.

``a2e`` and ``e2a`` run :class:`~afd_ascend_ops.reference.group.ReferenceGroup` on the
group ``group_ep`` names (see :mod:`afd_ascend_ops.registry`); ``aiv_num`` (the vector
cores of the Ascend kernel) has no meaning here. The CAM async ops have no CPU kernel
yet: calling one on CPU tensors raises NotImplementedError saying so (their fake kernels
exist, so adding the CPU kernels later changes no schema).

Every function repeats its schema's defaults: the dispatcher drops trailing arguments
equal to their defaults before calling a Python kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from afd_ascend_ops import registry


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
    return registry.lookup(group_ep).a2e(
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
    return registry.lookup(group_ep).e2a(
        expand_x, atten_batch_size, batch_size, hidden_size, topk, expert_rank_size,
        attention_rank_size, rank,
    )  # fmt: skip


def not_yet(name: str) -> Callable[..., Any]:
    """The CPU kernel of a CAM async op until its reference exists: a clear error."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"afd_ascend::{name} has no CPU reference kernel yet (planned for a later "
            "afd-ascend-ops release); only its fake kernel is registered. Use CAMP2P "
            "(a2e/e2a) on CPU, or the compiled Ascend kernels on an NPU"
        )

    return kernel


#: The CPU kernel of each op, by op name.
KERNELS: dict[str, Callable[..., Any]] = {
    "a2e": a2e,
    "e2a": e2a,
    **{
        name: not_yet(name)
        for name in (
            "afd_async_dispatch_send",
            "afd_async_dispatch_recv",
            "afd_async_combine_send",
            "afd_async_combine_recv",
        )
    },
}
