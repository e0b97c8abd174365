"""The stage planner: examples and properties of the request and token splits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from afd_core.config.stages import (
    DEFAULT_DECODE_TOKEN_THRESHOLD,
    DEFAULT_PREFILL_TOKEN_THRESHOLD,
    StagePolicy,
    StageSlice,
    plan_request_split,
)

#: Splits anything of two tokens or more.
EAGER = StagePolicy(decode_token_threshold=2, prefill_token_threshold=2)

batches = st.lists(st.integers(min_value=1, max_value=600), min_size=0, max_size=40)
thresholds = st.integers(min_value=2, max_value=2000)


def test_defaults_are_vllms_dbo_thresholds() -> None:
    policy = StagePolicy()
    assert (policy.decode_token_threshold, policy.prefill_token_threshold) == (32, 512)
    assert (DEFAULT_DECODE_TOKEN_THRESHOLD, DEFAULT_PREFILL_TOKEN_THRESHOLD) == (32, 512)


@pytest.mark.parametrize("field", ["decode_token_threshold", "prefill_token_threshold"])
def test_a_threshold_below_two_tokens_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=f"StagePolicy.{field} must be at least 2"):
        StagePolicy(**{field: 1})


def test_decodes_split_in_the_middle() -> None:
    assert plan_request_split([1] * 8, EAGER, decode_only=True) == (
        StageSlice(0, 4, 0, 4),
        StageSlice(4, 8, 4, 8),
    )


def test_the_boundary_nearest_half_the_tokens_wins() -> None:
    # Boundaries give 10|4, 12|2, 13|1 tokens: 10 is nearest 7.
    assert plan_request_split([10, 2, 1, 1], EAGER, decode_only=False) == (
        StageSlice(0, 1, 0, 10),
        StageSlice(1, 4, 10, 14),
    )


def test_a_token_tie_goes_to_the_boundary_nearest_half_the_requests() -> None:
    # 8 tokens: cutting after request 0 (3|5) or after request 1 (5|3) is as near half the
    # tokens; after request 1 is nearer half the 5 requests.
    assert plan_request_split([3, 2, 1, 1, 1], EAGER, decode_only=False) == (
        StageSlice(0, 2, 0, 5),
        StageSlice(2, 5, 5, 8),
    )


def test_a_full_tie_goes_to_the_earlier_boundary() -> None:
    # 3|5 and 5|3 tokens, 1|2 and 2|1 requests.
    assert plan_request_split([3, 2, 3], EAGER, decode_only=False)[0].request_stop == 1


def test_one_request_never_splits_at_a_request_boundary() -> None:
    assert plan_request_split([4000], EAGER, decode_only=False) == (StageSlice(0, 1, 0, 4000),)


def test_an_empty_batch_is_one_empty_stage() -> None:
    assert plan_request_split([], EAGER, decode_only=True) == (StageSlice(0, 0, 0, 0),)


def test_thresholds_pick_by_batch_kind() -> None:
    policy = StagePolicy(decode_token_threshold=8, prefill_token_threshold=20)
    assert len(plan_request_split([1] * 7, policy, decode_only=True)) == 1
    assert len(plan_request_split([1] * 8, policy, decode_only=True)) == 2
    assert len(plan_request_split([9, 10], policy, decode_only=False)) == 1
    assert len(plan_request_split([10, 10], policy, decode_only=False)) == 2


def test_a_request_without_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="request 1 schedules 0 tokens"):
        plan_request_split([1, 0], EAGER, decode_only=True)
    with pytest.raises(ValueError, match="request 0 schedules -1 tokens"):
        plan_request_split([-1, 1], EAGER, decode_only=True)


def _covers(stages: tuple[StageSlice, ...], tokens: list[int]) -> None:
    """The stages are contiguous, in order, and cover every token and request."""
    assert stages[0].token_start == 0 and stages[0].request_start == 0
    assert stages[-1].token_stop == sum(tokens) and stages[-1].request_stop == len(tokens)
    for a, b in itertools.pairwise(stages):
        assert a.token_stop == b.token_start


@given(batches, thresholds, thresholds, st.booleans())
def test_request_split_properties(
    tokens: list[int], decode_t: int, prefill_t: int, decode_only: bool
) -> None:
    policy = StagePolicy(decode_token_threshold=decode_t, prefill_token_threshold=prefill_t)
    stages = plan_request_split(tokens, policy, decode_only=decode_only)
    _covers(stages, tokens)
    total = sum(tokens)
    should_split = len(tokens) >= 2 and total >= policy.threshold(decode_only=decode_only)
    assert len(stages) == (2 if should_split else 1)
    # The rule Model Runner V2's dispatch asks, from the request and token counts alone.
    assert policy.splits_at_request(len(tokens), total, decode_only=decode_only) == should_split
    if len(stages) == 1:
        return
    first, second = stages
    k = first.request_stop
    assert 1 <= k < len(tokens) and second.request_start == k  # a request boundary
    assert first.num_tokens == sum(tokens[:k]) and second.num_tokens == sum(tokens[k:])
    # No boundary is nearer half the tokens, and none as near is nearer half the requests.
    mine = (abs(2 * first.num_tokens - total), abs(2 * k - len(tokens)))
    for j in range(1, len(tokens)):
        theirs = (abs(2 * sum(tokens[:j]) - total), abs(2 * j - len(tokens)))
        assert mine <= theirs
