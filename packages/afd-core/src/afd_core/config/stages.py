"""The stage planner: how one step's batch splits into two micro-batch stages.

With two stages per step (``"num_stages": 2``), the attention role runs the first part of
a batch while the FFN role computes the other part's layer, and the other way round. The
planner decides where to cut; it is pure (no torch, no vLLM) and so are its rules:

* :func:`plan_request_split` cuts at a request boundary: of the boundaries between two
  requests, the one whose token split is nearest half the step's tokens; on a tie the one
  nearest half the requests; on a further tie the earlier one. No split (one stage) with
  fewer than two requests or fewer tokens than the policy's threshold.

The thresholds (:class:`StagePolicy`) follow vLLM's DBO settings and their defaults
(``dbo_decode_token_threshold`` 32, ``dbo_prefill_token_threshold`` 512): a batch of
decodes only splits from the decode threshold, a batch with a prefill from the prefill
threshold. Below them one stage runs: the saved overlap would not pay for the second
stage's per-layer messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

#: vLLM's default ``dbo_decode_token_threshold``.
DEFAULT_DECODE_TOKEN_THRESHOLD = 32
#: vLLM's default ``dbo_prefill_token_threshold``.
DEFAULT_PREFILL_TOKEN_THRESHOLD = 512
#: The fewest tokens a split batch can have: one per stage.
MIN_TOKEN_THRESHOLD = 2

#: Where a two-stage step's kernels queue on CUDA: each stage on its own stream, or both
#: on the worker's stream (the config's ``stage_streams``).
StageStreams = Literal["per-stage", "shared"]
STAGE_STREAMS: tuple[StageStreams, ...] = ("per-stage", "shared")


@dataclass(frozen=True)
class StagePolicy:
    """When a step splits: at least ``decode_token_threshold`` tokens for a batch of
    decodes only, at least ``prefill_token_threshold`` for a batch with a prefill.

    Both must be at least :data:`MIN_TOKEN_THRESHOLD` (ValueError otherwise).
    """

    decode_token_threshold: int = DEFAULT_DECODE_TOKEN_THRESHOLD
    prefill_token_threshold: int = DEFAULT_PREFILL_TOKEN_THRESHOLD

    def __post_init__(self) -> None:
        for name in ("decode_token_threshold", "prefill_token_threshold"):
            value = getattr(self, name)
            if value < MIN_TOKEN_THRESHOLD:
                raise ValueError(
                    f"StagePolicy.{name} must be at least {MIN_TOKEN_THRESHOLD} (one token per "
                    f"stage), got {value}"
                )

    def threshold(self, *, decode_only: bool) -> int:
        """The fewest tokens a batch (of decodes only, or not) needs to split."""
        return self.decode_token_threshold if decode_only else self.prefill_token_threshold

    def splits_at_request(self, num_requests: int, num_tokens: int, *, decode_only: bool) -> bool:
        """Whether :func:`plan_request_split` cuts a batch of ``num_requests`` requests and
        ``num_tokens`` tokens in two: at least two requests and the threshold's tokens."""
        return num_requests >= 2 and num_tokens >= self.threshold(decode_only=decode_only)


@dataclass(frozen=True)
class StageSlice:
    """The part of a step's batch that one stage runs.

    Requests ``request_start .. request_stop - 1`` (batch order) and the step's tokens
    ``token_start .. token_stop - 1``.
    """

    request_start: int
    request_stop: int
    token_start: int
    token_stop: int

    @property
    def num_requests(self) -> int:
        """Requests (or parts of requests) in the stage."""
        return self.request_stop - self.request_start

    @property
    def num_tokens(self) -> int:
        """Tokens in the stage."""
        return self.token_stop - self.token_start


def _check_tokens(tokens_per_request: Sequence[int]) -> int:
    """The step's token count; ValueError for a request without tokens."""
    for i, tokens in enumerate(tokens_per_request):
        if tokens < 1:
            raise ValueError(
                f"stage planner: request {i} schedules {tokens} tokens; every scheduled "
                "request has at least one"
            )
    return sum(tokens_per_request)


def _one_stage(num_requests: int, num_tokens: int) -> tuple[StageSlice, ...]:
    return (StageSlice(0, num_requests, 0, num_tokens),)


def plan_request_split(
    tokens_per_request: Sequence[int], policy: StagePolicy, *, decode_only: bool
) -> tuple[StageSlice, ...]:
    """The stages of a step whose requests schedule ``tokens_per_request`` tokens each.

    Returns one stage (the whole batch) or two that cut at a request boundary (see the
    module docstring). ``decode_only``: the batch holds decodes only (picks the threshold).
    Raises ValueError for a request with fewer than one token.
    """
    total = _check_tokens(tokens_per_request)
    n = len(tokens_per_request)
    if not policy.splits_at_request(n, total, decode_only=decode_only):
        return _one_stage(n, total)
    best: tuple[int, int, int] | None = None  # (token distance, request distance, boundary)
    prefix = 0
    for k in range(1, n):
        prefix += tokens_per_request[k - 1]
        # Distances doubled, so that half of an odd count stays an integer.
        candidate = (abs(2 * prefix - total), abs(2 * k - n), k)
        if best is None or candidate < best:
            best = candidate
    assert best is not None  # n >= 2: at least one boundary
    k = best[2]
    cut = sum(tokens_per_request[:k])
    return (StageSlice(0, k, 0, cut), StageSlice(k, n, cut, total))
