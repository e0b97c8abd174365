"""``StepMerger``: the FFN side's rules for merging control payloads into steps.

Pure Python. Each attention rank's step ids must increase by one from payload to payload
(the first may be anything, also the first of a server that replaced the rank); every
rank of a step must run the same number of stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from afd_core.connector import FFNStep
from afd_core.errors import AFDProtocolError
from afd_core.wire.metadata import ControlPayload


class StepMerger:
    """Forms :class:`FFNStep` objects from the payloads of ``senders`` (attention ranks)."""

    def __init__(self, senders: Sequence[int]) -> None:
        self.senders = tuple(senders)
        self._last_step: dict[int, int] = {}

    def forget(self, rank: int) -> None:
        """A new server took attention rank ``rank``'s seat: its step ids start afresh."""
        self._last_step.pop(rank, None)

    def merge(self, ready: Mapping[int, ControlPayload]) -> FFNStep:
        """One step from ``ready`` (attention rank -> its next payload), in sender order.

        Raises AFDProtocolError for a payload from outside ``senders``, a wrong sender
        rank, a step id that does not follow the rank's previous one, or stage counts
        that differ between ranks. Nothing is recorded when it raises.
        """
        ranks = [r for r in self.senders if r in ready]
        strangers = sorted(set(ready) - set(self.senders))
        if strangers or not ranks:
            raise AFDProtocolError(
                f"AFD control: payloads from attention ranks {strangers} reached an FFN rank "
                f"serving {list(self.senders)}; both roles must use the same topology"
            )
        tokens = []
        for rank in ranks:
            payload = ready[rank]
            if payload.sender_rank != rank:
                raise AFDProtocolError(
                    f"AFD control: attention rank {rank} sent a payload signed by attention "
                    f"rank {payload.sender_rank}; set role_rank consistently on every server"
                )
            last = self._last_step.get(rank)
            if last is not None and payload.step_id != last + 1:
                raise AFDProtocolError(
                    f"AFD control: attention rank {rank} sent step {payload.step_id} after "
                    f"step {last}; step ids must increase by one (a step was lost or repeated)"
                )
            tokens.append(payload.tokens_of(rank))
        first = ranks[0]
        for rank, counts in zip(ranks, tokens, strict=True):
            if len(counts) != len(tokens[0]):
                raise AFDProtocolError(
                    f"AFD control: attention rank {first} runs {len(tokens[0])} stage(s) in "
                    f"step {ready[first].step_id}, attention rank {rank} runs {len(counts)} in "
                    f"step {ready[rank].step_id}; micro-batching must be set alike on all "
                    "attention ranks"
                )
        for rank in ranks:
            self._last_step[rank] = ready[rank].step_id
        return FFNStep(
            payloads=tuple(ready[r] for r in ranks),
            attention_ranks=tuple(ranks),
            tokens=tuple(tokens),
        )
