"""The rank map: blocks, world ranks, control senders (pure Python)."""

from __future__ import annotations

import pytest

from afd_core.errors import AFDConfigError
from afd_core.kit.pairing import ALL_TO_ALL, BLOCK
from afd_core.topology import Topology, attention_role_rank, ffn_role_rank

# (A, F) -> the block of attention ranks of each FFN rank.
BLOCKS = {
    (1, 1): [range(0, 1)],
    (2, 1): [range(0, 2)],
    (3, 2): [range(0, 2), range(2, 3)],
    (4, 2): [range(0, 2), range(2, 4)],
    (5, 3): [range(0, 2), range(2, 4), range(4, 5)],
}


@pytest.mark.parametrize(("a", "f"), sorted(BLOCKS))
def test_blocks_are_contiguous_larger_first_and_cover_every_attention_rank(a, f):
    topo = Topology(a, f)
    blocks = [topo.block_of(r) for r in range(f)]
    assert blocks == BLOCKS[a, f]
    assert [r for block in blocks for r in block] == list(range(a))
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(("a", "f"), sorted(BLOCKS))
def test_ffn_rank_of_is_the_inverse_of_block_of(a, f):
    topo = Topology(a, f)
    for ffn in range(f):
        for attention in topo.block_of(ffn):
            assert topo.ffn_rank_of(attention) == ffn


@pytest.mark.parametrize(("a", "f"), sorted(BLOCKS))
def test_world_ranks_put_ffn_ranks_first_and_round_trip(a, f):
    topo = Topology(a, f)
    assert topo.world_size == a + f
    assert [topo.world_rank("ffn", r) for r in range(f)] == list(range(f))
    assert [topo.world_rank("attention", r) for r in range(a)] == list(range(f, f + a))
    for world in range(a + f):
        role, rank = topo.role_of_world_rank(world)
        assert topo.world_rank(role, rank) == world


def test_fewer_attention_than_ffn_ranks_is_rejected_with_advice():
    with pytest.raises(
        AFDConfigError,
        match=r"num_attention_ranks \(1\) must be >= "
        r"num_ffn_ranks \(2\).*add attention ranks",
    ):
        Topology(1, 2)


@pytest.mark.parametrize(("a", "f"), [(0, 1), (1, 0), (-1, 1)])
def test_non_positive_counts_are_rejected(a, f):
    with pytest.raises(AFDConfigError, match="must both be positive"):
        Topology(a, f)


def test_ranks_outside_the_world_are_rejected_naming_the_key():
    topo = Topology(3, 2)
    with pytest.raises(
        AFDConfigError,
        match=r"attention rank 3 is outside 0\.\.2 "
        r"\(num_attention_ranks=3\)",
    ):
        topo.ffn_rank_of(3)
    with pytest.raises(AFDConfigError, match="num_ffn_ranks=2"):
        topo.block_of(2)
    with pytest.raises(AFDConfigError, match=r"world rank 5 is outside 0\.\.4"):
        topo.role_of_world_rank(5)


def test_describe_lists_each_ffn_rank_and_its_attention_ranks():
    text = Topology(3, 2).describe()
    assert "AFD world: 5 ranks (2 FFN first, then 3 attention)" in text
    assert "FFN 0 (world 0) serves: attention 0 (world 2), attention 1 (world 3)" in text
    assert "FFN 1 (world 1) serves: attention 2 (world 4)" in text


def test_an_attention_rank_is_its_dp_rank_unless_role_rank_is_set():
    assert attention_role_rank(dp_rank=2, explicit_rank=None) == 2
    assert attention_role_rank(dp_rank=0, explicit_rank=4) == 4


def test_every_ffn_worker_is_its_own_rank():
    assert [ffn_role_rank(1, 2, tp, None) for tp in range(2)] == [2, 3]
    assert ffn_role_rank(0, 2, 1, explicit_rank=4) == 5


def test_the_expert_rank_map_gives_every_ffn_rank_every_attention_rank():
    topo = Topology(2, 3, ALL_TO_ALL)  # fewer attention than FFN ranks is fine here
    assert [tuple(topo.block_of(f)) for f in range(3)] == [(0, 1)] * 3
    with pytest.raises(AFDConfigError, match="no single serving FFN rank"):
        topo.ffn_rank_of(0)
    assert "FFN 0 (world 0), which forwards each step" in topo.describe()


@pytest.mark.parametrize("pairing", [BLOCK, ALL_TO_ALL], ids=lambda p: p.name)
def test_each_pairing_answers_both_directions_alike(pairing):
    """``f`` serves ``a`` exactly when ``f`` is among the FFN ranks of ``a``."""
    for a in range(1, 9):
        for f in range(1, 9):
            if pairing.refusal(a, f) is not None:
                assert pairing is BLOCK and a < f
                continue
            topo = Topology(a, f, pairing)
            served = {(r, s) for s in range(f) for r in topo.block_of(s)}
            asked = {(r, s) for r in range(a) for s in topo.ffn_ranks_of(r)}
            assert served == asked
            assert {r for r, _ in served} == set(range(a))
