"""ExpertPlacement: contiguous blocks of routed experts over the FFN ranks (pure)."""

from __future__ import annotations

import pytest

from afd_core.errors import AFDConfigError
from afd_core.placement import ExpertPlacement


@pytest.mark.parametrize(
    ("experts", "ranks", "sizes"),
    [(8, 1, [8]), (8, 2, [4, 4]), (8, 3, [3, 3, 2]), (10, 4, [3, 3, 2, 2]), (5, 5, [1] * 5)],
)
def test_blocks_are_contiguous_and_differ_by_at_most_one_larger_first(experts, ranks, sizes):
    placement = ExpertPlacement(experts, ranks)
    blocks = [placement.block(f) for f in range(ranks)]
    assert [len(b) for b in blocks] == sizes
    assert [e for b in blocks for e in b] == list(range(experts))


@pytest.mark.parametrize(
    ("experts", "ranks", "sizes"),
    [(8, 1, [8]), (8, 3, [3, 3, 2]), (16, 3, [6, 6, 4]), (10, 4, [3, 3, 3, 1]), (5, 5, [1] * 5)],
)
def test_ceil_blocks_give_every_rank_but_the_last_ceil_e_over_f(experts, ranks, sizes):
    placement = ExpertPlacement(experts, ranks, "ceil")
    blocks = [placement.block(f) for f in range(ranks)]
    assert [len(b) for b in blocks] == sizes
    assert [e for b in blocks for e in b] == list(range(experts))
    assert all(placement.owner(e) == e // placement.per_rank for e in range(experts))


def test_a_ceil_split_that_leaves_the_last_rank_empty_is_a_config_error():
    # ceil(4 / 3) = 2 experts per rank: ranks 0 and 1 take all four.
    with pytest.raises(AFDConfigError, match=r"the last of num_ffn_ranks=3 FFN ranks would "
                       r"hold no expert .* use num_ffn_ranks=2"):  # fmt: skip
        ExpertPlacement(4, 3, "ceil")


@pytest.mark.parametrize("rule", ["balanced", "ceil"])
def test_owner_is_the_inverse_of_block(rule):
    placement = ExpertPlacement(10, 4, rule)
    for f in range(4):
        assert all(placement.owner(e) == f for e in placement.block(f))
    assert placement.owners() == tuple(placement.owner(e) for e in range(10))


def test_more_ffn_ranks_than_experts_is_a_config_error_naming_the_limit():
    with pytest.raises(AFDConfigError, match=r"8 routed experts cannot be split over "
                       r"num_ffn_ranks=9 .* use at most 8 FFN ranks"):  # fmt: skip
        ExpertPlacement(8, 9)


def test_ranks_and_experts_outside_the_placement_are_refused():
    placement = ExpertPlacement(8, 2)
    with pytest.raises(AFDConfigError, match=r"FFN rank 2 is outside 0\.\.1"):
        placement.block(2)
    with pytest.raises(AFDConfigError, match=r"expert 8 is outside 0\.\.7"):
        placement.owner(8)


def test_describe_names_every_rank_and_its_experts():
    assert ExpertPlacement(10, 4).describe().splitlines() == [
        "routed experts: 10 over 4 FFN rank(s) (balanced blocks)",
        "  FFN 0 holds experts 0..2 (3 experts)",
        "  FFN 1 holds experts 3..5 (3 experts)",
        "  FFN 2 holds experts 6..7 (2 experts)",
        "  FFN 3 holds experts 8..9 (2 experts)",
    ]
