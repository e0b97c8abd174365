"""Who talks to whom: the rank map of an AFD deployment.

An AFD world holds ``num_ffn_ranks`` FFN ranks followed by ``num_attention_ranks``
attention ranks (FFN first, so FFN rank 0 is world rank 0 and hosts the rendezvous
store). Two rank maps, by where the connector puts the routed experts:

* ``"block"`` (every FFN rank holds every expert): each FFN rank serves a contiguous
  block of attention ranks; block sizes differ by at most one, larger blocks first, so
  ``A >= F``.
* ``"expert"`` (routed experts split over the FFN ranks, :mod:`afd_core.placement`):
  every FFN rank serves every attention rank; any ``A`` and ``F``.

Who exchanges data and control with whom is the exchange pattern's pairing rule (a
connector's recipe, :mod:`afd_core.assembly`), built on these blocks.

Pure Python: no torch, no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from afd_core.errors import AFDConfigError

Role = Literal["attention", "ffn"]
ROLES: tuple[Role, ...] = ("attention", "ffn")
#: How a connector pairs the ranks (see the module docstring).
ExchangePattern = Literal["block", "expert"]
EXCHANGE_PATTERNS: tuple[ExchangePattern, ...] = ("block", "expert")


@dataclass(frozen=True)
class Topology:
    """The static rank map for ``num_attention_ranks`` (A) and ``num_ffn_ranks`` (F).

    With the ``"block"`` exchange it requires ``A >= F >= 1`` so that every FFN rank
    serves at least one attention rank; with ``"expert"`` any ``A, F >= 1``.
    """

    num_attention_ranks: int
    num_ffn_ranks: int
    exchange: ExchangePattern = "block"

    def __post_init__(self) -> None:
        a, f = self.num_attention_ranks, self.num_ffn_ranks
        if self.exchange not in EXCHANGE_PATTERNS:
            raise AFDConfigError(
                f"AFD topology: exchange pattern {self.exchange!r} is not one of "
                f"{list(EXCHANGE_PATTERNS)}"
            )
        if f < 1 or a < 1:
            raise AFDConfigError(
                f"AFD topology: num_attention_ranks ({a}) and num_ffn_ranks ({f}) "
                "must both be positive integers"
            )
        if a < f and self.exchange == "block":
            raise AFDConfigError(
                f"AFD topology: num_attention_ranks ({a}) must be >= num_ffn_ranks ({f}), "
                "since every FFN rank serves at least one attention rank; add attention "
                "ranks or use fewer FFN ranks"
            )

    @property
    def world_size(self) -> int:
        """Number of ranks in the AFD world (FFN ranks plus attention ranks)."""
        return self.num_attention_ranks + self.num_ffn_ranks

    def block_of(self, ffn_rank: int) -> range:
        """The attention ranks served by ``ffn_rank``, as a contiguous range.

        The first ``A % F`` blocks have ``A // F + 1`` ranks, the others ``A // F``.
        With the ``"expert"`` exchange every FFN rank serves every attention rank.
        """
        self._check_rank("ffn", ffn_rank)
        if self.exchange == "expert":
            return range(self.num_attention_ranks)
        base, extra = divmod(self.num_attention_ranks, self.num_ffn_ranks)
        start = ffn_rank * base + min(ffn_rank, extra)
        size = base + (1 if ffn_rank < extra else 0)
        return range(start, start + size)

    def ffn_rank_of(self, attention_rank: int) -> int:
        """The FFN rank that serves ``attention_rank`` (``"block"`` exchange only)."""
        self._check_rank("attention", attention_rank)
        if self.exchange == "expert":
            raise AFDConfigError(
                "AFD topology: with the expert exchange every FFN rank serves every attention "
                "rank; there is no single serving FFN rank"
            )
        base, extra = divmod(self.num_attention_ranks, self.num_ffn_ranks)
        big = extra * (base + 1)  # attention ranks covered by the larger blocks
        if attention_rank < big:
            return attention_rank // (base + 1)
        return extra + (attention_rank - big) // base

    def ffn_ranks_of(self, attention_rank: int) -> tuple[int, ...]:
        """The FFN ranks that serve ``attention_rank``: the one of its block, or with the
        ``"expert"`` exchange every FFN rank."""
        if self.exchange == "expert":
            self._check_rank("attention", attention_rank)
            return tuple(range(self.num_ffn_ranks))
        return (self.ffn_rank_of(attention_rank),)

    def world_rank(self, role: Role, role_rank: int) -> int:
        """World rank of ``role_rank`` of ``role`` (FFN ranks first)."""
        self._check_rank(role, role_rank)
        return role_rank if role == "ffn" else self.num_ffn_ranks + role_rank

    def role_of_world_rank(self, world_rank: int) -> tuple[Role, int]:
        """Inverse of :meth:`world_rank`: ``(role, role_rank)``."""
        if not 0 <= world_rank < self.world_size:
            raise AFDConfigError(
                f"AFD topology: world rank {world_rank} is outside 0..{self.world_size - 1}"
            )
        if world_rank < self.num_ffn_ranks:
            return "ffn", world_rank
        return "attention", world_rank - self.num_ffn_ranks

    def num_ranks(self, role: Role) -> int:
        """How many ranks ``role`` has."""
        return self.num_attention_ranks if role == "attention" else self.num_ffn_ranks

    def _check_rank(self, role: Role, role_rank: int) -> None:
        count = self.num_ranks(role)
        if not 0 <= role_rank < count:
            key = "num_attention_ranks" if role == "attention" else "num_ffn_ranks"
            raise AFDConfigError(
                f"AFD topology: {role} rank {role_rank} is outside 0..{count - 1} "
                f"({key}={count}); raise {key} or fix the rank of this process"
            )

    def describe(self, announced: bool = True) -> str:
        """A human-readable multi-line description (used by ``afd check``); ``announced``:
        the connector's attention ranks announce their steps (False: in-band counts)."""
        lines = [
            f"AFD world: {self.world_size} ranks "
            f"({self.num_ffn_ranks} FFN first, then {self.num_attention_ranks} attention)"
        ]
        if self.exchange == "expert":
            lines.append(
                "  expert exchange: every attention rank sends each token to the FFN ranks "
                "holding its experts"
            )
            lines.append(
                "  control payloads of every attention rank go to FFN 0 (world 0), which "
                "forwards each step to the other FFN ranks"
                if announced
                else "  no control plane: each dispatch carries its layer and counts; every FFN "
                "rank serves each attention rank's dispatches as they arrive (async DP)"
            )
            return "\n".join(lines)
        for f in range(self.num_ffn_ranks):
            block = self.block_of(f)
            attn = ", ".join(
                f"attention {a} (world {self.world_rank('attention', a)})" for a in block
            )
            lines.append(f"  FFN {f} (world {self.world_rank('ffn', f)}) serves: {attn}")
            senders = ", ".join(str(a) for a in block)
            lines.append(f"    control payloads from attention ranks: {senders}")
        return "\n".join(lines)


def attention_role_rank(dp_rank: int, explicit_rank: int | None) -> int:
    """Role rank of an attention worker: its data-parallel rank.

    An attention rank is one data-parallel group (its tensor-parallel ranks would hold
    the same tokens and share the rank; the role workers accept tensor parallel size 1
    only). ``explicit_rank`` (the config's ``role_rank``) replaces the DP rank for
    deployments started as separate servers.
    """
    return dp_rank if explicit_rank is None else explicit_rank


def ffn_role_rank(dp_rank: int, tp_size: int, tp_rank: int, explicit_rank: int | None) -> int:
    """Role rank of an FFN worker: every FFN worker is its own rank.

    ``explicit_rank`` (the config's ``role_rank``) is the rank of TP rank 0 of this
    deployment; the others follow it.
    """
    base = dp_rank * tp_size if explicit_rank is None else explicit_rank
    return base + tp_rank
