"""Which attention ranks an FFN rank exchanges with: the two pairings a pattern may use.

* :data:`BLOCK` (:class:`BlockPairing`; every FFN rank holds every expert): FFN rank ``f``
  serves a contiguous block of attention ranks, block sizes differ by at most one, larger
  blocks first, so ``A >= F``. The same split as vLLM's ``determine_expert_map`` and as
  :mod:`afd_core.placement`'s ``"balanced"`` rule.
* :data:`ALL_TO_ALL` (:class:`AllToAllPairing`; routed experts split over the FFN ranks):
  every FFN rank serves every attention rank; any ``A`` and ``F``.

A pattern's pairing follows from its expert placement
(:meth:`afd_core.assembly.Pattern.pairing`); :class:`~afd_core.topology.Topology` holds it
and answers rank questions through it, so no module asks which pairing it is.

Pure Python: no torch, no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Pairing(Protocol):
    """A pairing rule over ``a`` attention ranks and ``f`` FFN ranks (both >= 1, ranks
    already checked by the caller)."""

    @property
    def name(self) -> str:
        """The rule's name in ``afd check`` and errors."""
        ...

    def refusal(self, a: int, f: int) -> str | None:
        """Why ``a`` attention ranks and ``f`` FFN ranks cannot pair, or None."""
        ...

    def attention_ranks_of(self, ffn_rank: int, a: int, f: int) -> range:
        """The attention ranks ``ffn_rank`` serves."""
        ...

    def ffn_ranks_of(self, attention_rank: int, a: int, f: int) -> tuple[int, ...]:
        """The FFN ranks that serve ``attention_rank``, ascending."""
        ...

    def summary(self, announced: bool) -> tuple[str, ...]:
        """Lines ``afd check`` prints before the per-rank lines (``announced``: the
        attention ranks announce their steps); empty when the rank lines say it all."""
        ...

    @property
    def lists_ranks(self) -> bool:
        """Whether ``afd check`` lists each FFN rank's attention ranks."""
        ...


@dataclass(frozen=True)
class BlockPairing:
    """FFN rank ``f`` serves the ``f``-th contiguous block of attention ranks."""

    @property
    def name(self) -> str:
        return "block"

    @property
    def lists_ranks(self) -> bool:
        return True

    def refusal(self, a: int, f: int) -> str | None:
        if a >= f:
            return None
        return (
            f"num_attention_ranks ({a}) must be >= num_ffn_ranks ({f}), since every FFN "
            "rank serves at least one attention rank; add attention ranks or use fewer FFN "
            "ranks (the connector pairs ranks in blocks)"
        )

    def attention_ranks_of(self, ffn_rank: int, a: int, f: int) -> range:
        base, extra = divmod(a, f)
        start = ffn_rank * base + min(ffn_rank, extra)
        return range(start, start + base + (1 if ffn_rank < extra else 0))

    def ffn_ranks_of(self, attention_rank: int, a: int, f: int) -> tuple[int, ...]:
        base, extra = divmod(a, f)
        big = extra * (base + 1)  # attention ranks covered by the larger blocks
        if attention_rank < big:
            return (attention_rank // (base + 1),)
        return (extra + (attention_rank - big) // base,)

    def summary(self, announced: bool) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class AllToAllPairing:
    """Every FFN rank serves every attention rank (each holds a part of the experts)."""

    @property
    def name(self) -> str:
        return "all-to-all"

    @property
    def lists_ranks(self) -> bool:
        return False

    def refusal(self, a: int, f: int) -> str | None:
        return None

    def attention_ranks_of(self, ffn_rank: int, a: int, f: int) -> range:
        return range(a)

    def ffn_ranks_of(self, attention_rank: int, a: int, f: int) -> tuple[int, ...]:
        return tuple(range(f))

    def summary(self, announced: bool) -> tuple[str, ...]:
        control = (
            "  control payloads of every attention rank go to FFN 0 (world 0), which "
            "forwards each step to the other FFN ranks"
            if announced
            else "  no control plane: each dispatch carries its layer and counts; every FFN "
            "rank serves each attention rank's dispatches as they arrive (async DP)"
        )
        return (
            "  expert exchange: every attention rank sends each token to the FFN ranks "
            "holding its experts",
            control,
        )


BLOCK = BlockPairing()
ALL_TO_ALL = AllToAllPairing()
