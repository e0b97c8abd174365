"""Who talks to whom: the rank map of an AFD deployment.

An AFD world holds ``num_ffn_ranks`` FFN ranks followed by ``num_attention_ranks``
attention ranks (FFN first, so FFN rank 0 is world rank 0 and hosts the rendezvous
store). Which attention ranks an FFN rank serves is the pairing the connector's pattern
uses (:mod:`afd_core.kit.pairing`: blocks of attention ranks, or every FFN rank with
every attention rank); :class:`Topology` holds the sizes and the pairing and answers
rank questions through it.

Pure Python: no torch, no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from afd_core.errors import AFDConfigError
from afd_core.kit.pairing import BLOCK, Pairing

Role = Literal["attention", "ffn"]
ROLES: tuple[Role, ...] = ("attention", "ffn")


@dataclass(frozen=True)
class Topology:
    """The static rank map for ``num_attention_ranks`` (A) and ``num_ffn_ranks`` (F),
    paired by ``pairing`` (``A, F >= 1``, and whatever the pairing requires: blocks need
    ``A >= F``).
    """

    num_attention_ranks: int
    num_ffn_ranks: int
    pairing: Pairing = BLOCK

    def __post_init__(self) -> None:
        a, f = self.num_attention_ranks, self.num_ffn_ranks
        if f < 1 or a < 1:
            raise AFDConfigError(
                f"AFD topology: num_attention_ranks ({a}) and num_ffn_ranks ({f}) "
                "must both be positive integers"
            )
        refusal = self.pairing.refusal(a, f)
        if refusal is not None:
            raise AFDConfigError(f"AFD topology: {refusal}")

    @property
    def world_size(self) -> int:
        """Number of ranks in the AFD world (FFN ranks plus attention ranks)."""
        return self.num_attention_ranks + self.num_ffn_ranks

    def block_of(self, ffn_rank: int) -> range:
        """The attention ranks served by ``ffn_rank``, as a contiguous range (its block;
        every attention rank when the pairing is all-to-all)."""
        self._check_rank("ffn", ffn_rank)
        return self.pairing.attention_ranks_of(
            ffn_rank, self.num_attention_ranks, self.num_ffn_ranks
        )

    def ffn_rank_of(self, attention_rank: int) -> int:
        """The one FFN rank that serves ``attention_rank``; AFDConfigError when the
        pairing gives it several (all-to-all)."""
        ranks = self.ffn_ranks_of(attention_rank)
        if len(ranks) != 1:
            raise AFDConfigError(
                f"AFD topology: with the {self.pairing.name} pairing every FFN rank serves "
                "every attention rank; there is no single serving FFN rank"
            )
        return ranks[0]

    def ffn_ranks_of(self, attention_rank: int) -> tuple[int, ...]:
        """The FFN ranks that serve ``attention_rank``, ascending."""
        self._check_rank("attention", attention_rank)
        return self.pairing.ffn_ranks_of(
            attention_rank, self.num_attention_ranks, self.num_ffn_ranks
        )

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
        lines.extend(self.pairing.summary(announced))
        for f in range(self.num_ffn_ranks if self.pairing.lists_ranks else 0):
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
