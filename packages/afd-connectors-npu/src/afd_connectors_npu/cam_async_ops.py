"""The call sites of the ``afd_ascend`` CAM async ops for one rank.

The ops (afd-ascend-ops) take the world's shape and this rank's place in it on every
call; :class:`CamAsyncOps` fixes those once and gives each role's two calls a name.
``attn_rank_id`` is the attention rank, ``moe_rank_id`` the FFN rank in the kernels'
attention-first numbering (``A + f``, :attr:`CamAsyncOps.moe_rank_id`);
``route_expert_num_per_moe``
is ``ceil(E / F)``, which is also the placement rule (an expert's owner is
``expert // route_expert_num_per_moe``, :class:`afd_core.placement.ExpertPlacement` with
``rule="ceil"``); ``max_seq_len`` is ``max_num_batched_tokens`` (both roles agree on it,
the rendezvous compares it); ``tp_size`` is 1 (afd's attention TP leader exchanges for
its replica); ``comm_args`` and ``comm_id`` are the compiled kernels' placeholders
(an fp16 ``[1]`` and 0); ``dynamic_quant`` is 0. Which kernel runs is the tensors'
device's: the CPU reference kernels on CPU tensors, the Ascend kernels on NPU tensors
(when built). Importing this module imports no torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: ``tp_size`` of every call (see the module docstring).
TP_SIZE = 1


@dataclass(frozen=True)
class CamAsyncOps:
    """The CAM async ops of ``role_rank`` in a world of ``num_ffn_ranks`` FFN ranks and
    ``num_attention_ranks`` attention ranks, ``experts_per_rank`` routed experts per FFN
    rank (the largest block), ``top_k`` experts per token, ``max_seq_len`` tokens per
    step at most; ``hidden_size`` is the wire's."""

    role_rank: int
    num_ffn_ranks: int
    num_attention_ranks: int
    experts_per_rank: int
    top_k: int
    hidden_size: int
    max_seq_len: int

    @property
    def moe_rank_id(self) -> int:
        """This FFN rank in the kernels' attention-first numbering."""
        return self.num_attention_ranks + self.role_rank

    @property
    def world_size(self) -> int:
        """Every rank of the world."""
        return self.num_ffn_ranks + self.num_attention_ranks

    def dispatch(
        self, hidden: torch.Tensor, expert_ids: torch.Tensor, layer: int, group: str
    ) -> None:
        """Attention: send each token of ``hidden`` ``[n, H]`` with its top-k global
        ``expert_ids`` (int32 ``[n, k]``) to the FFN ranks that own those experts."""
        import torch

        torch.ops.afd_ascend.afd_async_dispatch_send(
            hidden, expert_ids, _comm_args(), 0, self.max_seq_len, hidden.shape[0],
            self.hidden_size, self.top_k, self.num_ffn_ranks, self.num_attention_ranks,
            self.experts_per_rank, self.role_rank, self.world_size, layer, TP_SIZE, 0, group,
        )  # fmt: skip

    def combine(
        self, anchor: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, group: str
    ) -> torch.Tensor:
        """Attention: the routed-expert output of the last dispatch on ``group``, each
        token's expert rows weighted with ``weights`` (float32 ``[n, k]``) and summed; a
        new ``[n, H]`` tensor in ``anchor``'s dtype."""
        import torch

        return torch.ops.afd_ascend.afd_async_combine_recv(
            anchor, expert_ids, weights, _comm_args(), 0, expert_ids.shape[0],
            self.hidden_size, self.top_k, self.num_ffn_ranks, self.num_attention_ranks,
            self.experts_per_rank, self.role_rank, self.world_size, group,
        )  # fmt: skip

    def receive(
        self, dtype: torch.dtype, group: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """FFN: the next dispatch on ``group`` from any attention rank: its expanded rows
        (one per (token, local expert), grouped by local expert; the valid ones first) and
        its ``batch_info`` (afd-ascend-ops' ``BATCH_INFO`` layout), and the rows per local
        expert as a third element."""
        import torch

        expanded, _, info, counts = torch.ops.afd_ascend.afd_async_dispatch_recv(
            torch.empty(1, dtype=dtype), _comm_args(), 0, self.max_seq_len, self.hidden_size,
            self.top_k, self.num_ffn_ranks, self.num_attention_ranks, self.experts_per_rank,
            self.moe_rank_id, self.world_size, TP_SIZE, 0, group,
        )  # fmt: skip
        return expanded, info, counts

    def answer(self, output: torch.Tensor, batch_info: torch.Tensor, group: str) -> None:
        """FFN: return ``output`` (one unweighted expert row per expanded row) to the
        attention rank of ``batch_info``."""
        import torch

        torch.ops.afd_ascend.afd_async_combine_send(
            output, _comm_args(), batch_info, 0, self.max_seq_len, self.hidden_size,
            self.top_k, self.num_ffn_ranks, self.num_attention_ranks, self.experts_per_rank,
            self.moe_rank_id, self.world_size, TP_SIZE, group,
        )  # fmt: skip


@functools.cache
def _comm_args() -> torch.Tensor:
    """The compiled kernels' ``comm_args`` placeholder (read by no op: made once)."""
    import torch

    return torch.zeros(1, dtype=torch.float16)
