"""Tensor helpers of the expert-routed exchange: who gets which rows, and the way back.

* :func:`rows_per_rank` (attention side): for each FFN rank, the rows (tokens) with at
  least one of their top-k experts in its block, ascending;
* :func:`localize` (FFN side): global expert ids to the rank's local ids; a slot whose
  expert lives elsewhere gets weight 0 and the id of one of the row's own experts (vLLM's
  CPU MoE kernel has no "skip" id: weight 0 makes the slot add nothing, which is
  bit-identical to leaving it out);
* :func:`combine` (attention side): the FFN ranks' partial results summed per token in
  float32 and rounded once to the model dtype, as vLLM's MoE kernels round their top-k
  sum once. With one FFN rank the partial *is* the result (no re-rounding at all; float32
  partials are rounded once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from afd_core.errors import AFDProtocolError

if TYPE_CHECKING:
    import torch


def rows_per_rank(
    topk_ids: torch.Tensor, owners: torch.Tensor, num_ffn_ranks: int
) -> list[torch.Tensor]:
    """``result[f]``: indices (int64, ascending) of the rows with an expert on FFN rank ``f``.

    ``owners[e]`` is the FFN rank of global expert ``e`` (an int64 tensor on the device of
    ``topk_ids``). A fixed number of tensor operations whatever the number of FFN ranks
    (one mask of ranks by rows, one ``nonzero``, one host read of the counts).
    """
    import torch

    num_rows, device = topk_ids.shape[0], topk_ids.device
    if num_ffn_ranks == 1:  # every expert is there
        return [torch.arange(num_rows, device=device)]
    owner = owners[topk_ids.long()]
    hit = torch.zeros((num_ffn_ranks, num_rows), dtype=torch.bool, device=device)
    hit.scatter_(0, owner.t(), True)  # hit[f, row]: one of row's experts is on rank f
    rows = hit.nonzero()[:, 1]  # rank by rank, rows ascending
    return list(rows.split(hit.sum(dim=1).tolist()))


def localize(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, block: range
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(local ids int32, weights float32)`` of rows routed to the FFN rank of ``block``.

    Raises AFDProtocolError when a row has none of its experts in ``block`` (the sender
    routed it to the wrong FFN rank).
    """
    import torch

    owned = (topk_ids >= block.start) & (topk_ids < block.stop)
    if topk_ids.shape[0] and not bool(owned.any(dim=1).all()):
        stray = int((~owned.any(dim=1)).sum())
        raise AFDProtocolError(
            f"AFD expert routing: {stray} row(s) reached the FFN rank of experts "
            f"{block.start}..{block.stop - 1} without an expert there; both roles must use "
            "the same expert placement (num_ffn_ranks) and model"
        )
    local = (topk_ids - block.start).to(torch.int32)
    own = local.gather(1, owned.to(torch.int8).argmax(dim=1, keepdim=True))
    return torch.where(owned, local, own), torch.where(owned, topk_weights, 0.0).float()


def combine(
    num_tokens: int,
    parts: list[tuple[torch.Tensor, torch.Tensor]],
    hidden_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The per-token sum of ``parts`` (``(row indices, partial rows)`` per FFN rank)."""
    import torch

    used = [(rows, partial) for rows, partial in parts if rows.numel()]
    if len(used) == 1 and used[0][0].numel() == num_tokens:
        # Every row from one rank, in order: nothing to add, at most one rounding (of
        # float32 partials).
        return used[0][1].to(dtype)
    total = torch.zeros((num_tokens, hidden_size), dtype=torch.float32, device=device)
    for rows, partial in used:
        total.index_add_(0, rows, partial.float())
    return total.to(dtype)
