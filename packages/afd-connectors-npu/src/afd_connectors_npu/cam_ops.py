"""The call sites of the ``afd_ascend`` CAM P2P ops (``a2e``, ``e2a``) for one rank.

The ops (afd-ascend-ops) take the world's shape and this rank's place in it on every
call; :class:`CamP2pOps` fixes those once and gives each role's two calls a name.
World ranks are FFN first (``rank < expert_rank_size`` is an FFN rank); ``topk`` is 0
and ``compute_gate`` 0, since the gate runs on the FFN role. Which kernel runs is the
tensors' device's: the CPU reference kernels on CPU tensors, the Ascend kernels on NPU
tensors (when built). The tensors the FFN side makes for its receive are made on
``device``, the op plane's (:func:`afd_connectors_npu.providers.op_device`), so an FFN rank
on NPU reaches the NPU kernels. Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CamP2pOps:
    """``a2e``/``e2a`` of world rank ``rank`` in a world of ``num_ffn_ranks`` FFN ranks and
    ``num_attention_ranks`` attention ranks; ``hidden_size`` is the wire's, ``cores`` the
    ``aiv_num`` of this role, ``device`` where the FFN side makes its receive's tensors."""

    rank: int
    num_ffn_ranks: int
    num_attention_ranks: int
    hidden_size: int
    cores: int
    device: str = "cpu"

    def attention_send(self, hidden: torch.Tensor, group: str) -> torch.Tensor:
        """Attention side of ``a2e``: send ``hidden`` ``[n, H]`` to this rank's FFN rank;
        returns ``atten_batch_size``, which the matching :meth:`attention_receive` takes."""
        import torch

        outputs = torch.ops.afd_ascend.a2e(
            hidden, None, None, hidden.shape[0], self.hidden_size, 0, self.num_ffn_ranks,
            self.num_attention_ranks, self.rank, group, self.cores, 0,
        )  # fmt: skip
        return outputs[3]

    def attention_receive(
        self, hidden: torch.Tensor, atten_batch_size: torch.Tensor, group: str
    ) -> torch.Tensor:
        """Attention side of ``e2a``: the FFN result of the rows ``hidden`` sent, a new
        ``[n, H]`` tensor."""
        import torch

        return torch.ops.afd_ascend.e2a(
            hidden, atten_batch_size, hidden.shape[0], self.hidden_size, 0,
            self.num_ffn_ranks, self.num_attention_ranks, self.rank, group, self.cores,
        )  # fmt: skip

    def ffn_receive(
        self, expected: Sequence[int], batch_size: int, dtype: torch.dtype, group: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """FFN side of ``a2e``: the rows of the attention ranks of this FFN rank's block,
        concatenated in block order, and their counts (``atten_batch_size``), on ``device``.

        ``expected``: the rows expected from each attention rank of the block, -1 for a
        rank that takes no part in this call; ``batch_size`` their sum.
        """
        import torch

        placeholder = torch.empty((0, self.hidden_size), dtype=dtype, device=self.device)
        expected_rows = torch.tensor(expected, dtype=torch.int32, device=self.device)
        outputs = torch.ops.afd_ascend.a2e(
            placeholder, expected_rows, None, batch_size, self.hidden_size, 0, self.num_ffn_ranks,
            self.num_attention_ranks, self.rank, group, self.cores, 0,
        )  # fmt: skip
        return outputs[0], outputs[3]

    def ffn_send(self, output: torch.Tensor, atten_batch_size: torch.Tensor, group: str) -> None:
        """FFN side of ``e2a``: send each attention rank of the last ``a2e`` its rows of
        ``output``."""
        import torch

        torch.ops.afd_ascend.e2a(
            output, atten_batch_size, output.shape[0], self.hidden_size, 0,
            self.num_ffn_ranks, self.num_attention_ranks, self.rank, group, self.cores,
        )  # fmt: skip
