"""Dispatch, local experts and combine of the expert-routed exchange, against a dense MoE.

A dense per-token MoE (every token through its top-k experts, weighted, summed) is the
reference; the routed path splits the experts over FFN ranks with afd-core's helpers
(rows per rank, local ids, the combine), runs each rank's experts on its rows only, and
must give the same result.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from afd_core.errors import AFDProtocolError  # noqa: E402
from afd_core.placement import ExpertPlacement  # noqa: E402
from afd_core.runtime.expert.routing import combine, localize, rows_per_rank  # noqa: E402

E, K, H, T = 8, 2, 16, 40


def experts_of(seed: int = 0) -> torch.Tensor:
    """One weight matrix per expert: expert ``e`` maps ``x`` to ``x @ W[e]``."""
    return torch.randn(E, H, H, generator=torch.Generator().manual_seed(seed))


def routing(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(torch.int32)
    weights = torch.rand(T, K, generator=gen)
    return ids, weights


def dense_moe(x, weights_per_expert, ids, weights):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(K):
            out[t] += weights[t, j] * (x[t] @ weights_per_expert[ids[t, j]])
    return out


def local_moe(x, local_weights, local_ids, local_w):
    """What an FFN rank computes: its experts only (slots of weight 0 add nothing)."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(K):
            out[t] += local_w[t, j] * (x[t] @ local_weights[local_ids[t, j]])
    return out


@pytest.mark.parametrize("num_ffn_ranks", [1, 2, 3, 8])
def test_dispatch_local_experts_and_combine_equal_a_dense_moe(num_ffn_ranks):
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(2))
    w = experts_of()
    ids, weights = routing()
    placement = ExpertPlacement(E, num_ffn_ranks)
    owners = torch.tensor(placement.owners())
    parts = []
    for f, rows in enumerate(rows_per_rank(ids, owners, num_ffn_ranks)):
        block = placement.block(f)
        local_ids, local_w = localize(ids[rows], weights[rows], block)
        partial = local_moe(x[rows], w[block.start : block.stop], local_ids, local_w)
        parts.append((rows, partial))
    routed = combine(T, parts, H, torch.float32, torch.device("cpu"))
    # float32 sums in another order: equal to rounding (the reference adds slot by slot).
    torch.testing.assert_close(routed, dense_moe(x, w, ids, weights), rtol=1e-5, atol=1e-5)


def test_a_token_goes_once_to_each_rank_holding_one_of_its_experts_and_nowhere_else():
    ids = torch.tensor([[0, 1], [0, 5], [6, 7], [3, 4]], dtype=torch.int32)
    placement = ExpertPlacement(8, 2)  # experts 0..3 | 4..7
    rows = rows_per_rank(ids, torch.tensor(placement.owners()), 2)
    assert [r.tolist() for r in rows] == [[0, 1, 3], [1, 2, 3]]


def test_a_rank_that_holds_none_of_the_experts_gets_no_rows():
    ids = torch.tensor([[0, 6], [1, 2], [7, 6]], dtype=torch.int32)
    placement = ExpertPlacement(8, 3)  # experts 0..2 | 3..5 | 6..7
    rows = rows_per_rank(ids, torch.tensor(placement.owners()), 3)
    assert [r.tolist() for r in rows] == [[0, 1], [], [0, 2]]
    assert all(r.dtype == torch.int64 for r in rows)


def test_local_ids_keep_own_experts_and_give_foreign_slots_weight_zero():
    ids = torch.tensor([[4, 1], [6, 7]], dtype=torch.int32)
    weights = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    local, local_w = localize(ids, weights, range(4, 8))
    assert local.dtype == torch.int32 and local_w.dtype == torch.float32
    assert local.tolist() == [[0, 0], [2, 3]]  # the foreign slot takes an own expert's id
    assert local_w.tolist() == [[0.25, 0.0], [0.5, 0.5]]


def test_a_row_without_an_expert_of_the_rank_is_refused():
    ids = torch.tensor([[0, 1]], dtype=torch.int32)
    with pytest.raises(AFDProtocolError, match=r"1 row\(s\) reached the FFN rank of experts 4..7"):
        localize(ids, torch.ones(1, 2), range(4, 8))


def test_one_rank_with_every_row_hands_its_partial_through_unrounded():
    partial = torch.randn(5, H).to(torch.bfloat16)
    out = combine(5, [(torch.arange(5), partial)], H, torch.bfloat16, torch.device("cpu"))
    assert out is partial


def test_partials_are_added_in_float32_and_rounded_once():
    a = torch.full((1, 1), 1.0, dtype=torch.bfloat16)
    b = torch.full((1, 1), 2.0**-8, dtype=torch.bfloat16)  # half a bf16 ulp of 1.0
    rows = torch.tensor([0])
    out = combine(1, [(rows, a), (rows, b), (rows, b)], 1, torch.bfloat16, torch.device("cpu"))
    # Added in bf16 one by one each half ulp rounds away (to even); in float32 they make
    # one whole ulp.
    assert ((a + b) + b).item() == 1.0
    assert out.item() == 1.0 + 2.0**-7


def test_one_float32_partial_is_rounded_once_to_the_model_dtype():
    partial = torch.full((2, 1), 1.0 + 2.0**-9)  # a quarter bf16 ulp above 1.0
    out = combine(2, [(torch.arange(2), partial)], 1, torch.bfloat16, torch.device("cpu"))
    assert out.dtype == torch.bfloat16 and out.tolist() == [[1.0], [1.0]]
