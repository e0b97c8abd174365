"""Which FFN rank holds which routed experts (expert-routed connectors). Pure Python.

The ``num_experts`` routed experts are split over the ``num_ffn_ranks`` FFN ranks in
contiguous blocks, by one of two rules (a connector's pattern names the one it uses,
:attr:`afd_core.assembly.Pattern.expert_placement`):

* ``"balanced"`` (afd-core's expert-routed connector): blocks whose sizes differ by at most
  one, larger blocks first: with ``base, extra = divmod(E, F)``, FFN rank ``f`` holds
  ``base + 1`` experts when ``f < extra``, else ``base``, starting right after rank
  ``f - 1``'s block. (The same rule as vLLM's own expert-parallel split,
  ``determine_expert_map``, and as the attention-rank blocks of :mod:`afd_core.topology`.)
* ``"ceil"`` (the CAM async ops, whose kernels find an expert's owner as
  ``expert // per_rank``): every FFN rank but the last holds ``per_rank = ceil(E / F)``
  experts, the last one the rest. 16 experts over 3 ranks: 6, 6, 4 (balanced: 6, 5, 5).

Either way every FFN rank holds at least one expert, so ``num_experts >= num_ffn_ranks``
(and, with ``"ceil"``, ``num_experts > (F - 1) * ceil(E / F)``).

A token goes to every FFN rank that holds at least one of its top-k experts, once per
such rank; that rank computes only its experts of the token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from afd_core.errors import AFDConfigError

PlacementRule = Literal["balanced", "ceil"]
PLACEMENT_RULES: tuple[PlacementRule, ...] = ("balanced", "ceil")


@dataclass(frozen=True)
class ExpertPlacement:
    """The expert blocks of ``num_ffn_ranks`` FFN ranks over ``num_experts`` experts, by
    ``rule`` (see the module docstring)."""

    num_experts: int
    num_ffn_ranks: int
    rule: PlacementRule = "balanced"

    def __post_init__(self) -> None:
        e, f = self.num_experts, self.num_ffn_ranks
        if self.rule not in PLACEMENT_RULES:
            raise AFDConfigError(
                f"AFD: expert placement rule {self.rule!r} is not one of {PLACEMENT_RULES}"
            )
        if f < 1 or e < f:
            raise AFDConfigError(
                f"AFD config: the model's {e} routed experts cannot be split over "
                f"num_ffn_ranks={f} FFN ranks (each FFN rank holds at least one expert); "
                f"use at most {max(e, 1)} FFN ranks"
            )
        if self.rule == "ceil" and e <= (f - 1) * self.per_rank:
            fits = [n for n in range(1, f) if e > (n - 1) * -(-e // n)]
            raise AFDConfigError(
                f"AFD config: with {self.per_rank} experts per FFN rank (ceil({e}/{f}), the "
                f"rule of the CAM ops) the last of num_ffn_ranks={f} FFN ranks would hold no "
                f"expert of the model's {e}; use num_ffn_ranks={fits[-1]} or another count "
                "whose last rank keeps an expert"
            )

    @property
    def per_rank(self) -> int:
        """The largest block: ``ceil(num_experts / num_ffn_ranks)`` (under either rule)."""
        return -(-self.num_experts // self.num_ffn_ranks)

    def block(self, ffn_rank: int) -> range:
        """The global expert ids FFN rank ``ffn_rank`` holds (contiguous)."""
        if not 0 <= ffn_rank < self.num_ffn_ranks:
            raise AFDConfigError(f"AFD: FFN rank {ffn_rank} is outside 0..{self.num_ffn_ranks - 1}")
        if self.rule == "ceil":
            start = ffn_rank * self.per_rank
            return range(start, min(start + self.per_rank, self.num_experts))
        base, extra = divmod(self.num_experts, self.num_ffn_ranks)
        start = ffn_rank * base + min(ffn_rank, extra)
        return range(start, start + base + (1 if ffn_rank < extra else 0))

    def owner(self, expert: int) -> int:
        """The FFN rank holding global expert ``expert``."""
        if not 0 <= expert < self.num_experts:
            raise AFDConfigError(f"AFD: expert {expert} is outside 0..{self.num_experts - 1}")
        if self.rule == "ceil":
            return expert // self.per_rank
        base, extra = divmod(self.num_experts, self.num_ffn_ranks)
        big = extra * (base + 1)
        if expert < big:
            return expert // (base + 1)
        return extra + (expert - big) // base

    def owners(self) -> tuple[int, ...]:
        """``owners()[e]`` is the FFN rank of expert ``e`` (a lookup table)."""
        return tuple(f for f in range(self.num_ffn_ranks) for _ in self.block(f))

    def describe(self) -> str:
        """One line per FFN rank: which experts it holds (used by ``afd check``)."""
        lines = [
            f"routed experts: {self.num_experts} over {self.num_ffn_ranks} FFN rank(s) "
            f"({self.rule} blocks)"
        ]
        for f in range(self.num_ffn_ranks):
            block = self.block(f)
            lines.append(
                f"  FFN {f} holds experts {block.start}..{block.stop - 1} ({len(block)} experts)"
            )
        return "\n".join(lines)
