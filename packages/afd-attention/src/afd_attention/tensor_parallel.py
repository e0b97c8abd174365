"""Attention tensor parallelism: the TP leader exchanges, the other TP ranks take its results.

After the attention block's all-reduce every tensor-parallel rank of an attention
replica holds the same hidden states, so one of them is enough to talk to the FFN role:
TP rank 0 (the *leader*) is the attention rank in AFD terms. It opens the connector, runs
the steps and exchanges every layer as without TP (:class:`~afd_attention.step_driver.StepDriver`),
then broadcasts each result over vLLM's TP group (:func:`tp_broadcast`); every other TP
rank (a *follower*, :class:`TPFollower`) runs the same forwards and takes each layer's
result from that broadcast. No token goes to the FFN role more than once, the FFN role
sees one sender per attention rank, and the AFD topology, rank maps and ``afd check``
mean what they mean without TP.

The other design, each TP rank exchanging a 1/T share of the tokens and gathering the
results, cuts the bytes per link by T but makes each FFN rank take T senders per
attention rank (T times the messages, each 1/T the size) and needs the FFN side to know
the TP layout; the broadcast keeps the FFN side as it is and adds one collective on the
attention side's own TP group. The measurement that chose it is in docs/performance.md
("Attention TP"; ``benchmarks/tp_exchange.py``).

Both kinds of rank run every forward in the same order (vLLM's TP workers execute the
same scheduled batches, dummy runs and warm-ups), so each exchange on the leader meets
the same exchange on every follower. Torch and vLLM are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

from afd_attention.step_driver import SCHEDULED, StepFlags
from afd_core.errors import AFDConfigError

T = TypeVar("T")

#: The TP rank that exchanges with the FFN role.
TP_LEADER = 0


def tp_broadcast(tensor: Any) -> Any:
    """Broadcast ``tensor`` in place from the TP leader over vLLM's TP group; return it."""
    from vllm.distributed import get_tp_group

    return get_tp_group().broadcast(tensor, src=TP_LEADER)


class TPFollower:
    """The step driver of a TP rank other than the leader: what the attention runner and
    the exchange op call, with no connector behind it.

    The leader announces every step, so beginning one is a no-op here; each exchange
    returns a new tensor shaped like ``hidden`` filled by ``broadcast`` (in place, from
    the leader). ``exchanges`` counts them.
    """

    def __init__(self, broadcast: Callable[[Any], Any] = tp_broadcast) -> None:
        self._broadcast = broadcast
        self.exchanges = 0

    @contextmanager
    def dummy_flags(self, flags: StepFlags) -> Iterator[None]:
        """Nothing to label: the leader labels the step."""
        yield

    def begin_step(self, num_tokens: int, flags: StepFlags = SCHEDULED) -> None:
        """Nothing to announce: the leader announces the step."""

    def begin_stages(self, stage_tokens: Any, flags: StepFlags = SCHEDULED) -> None:
        """Two stages per step with TP are refused at start-up; reaching this is a bug."""
        raise AFDConfigError(
            "AFD attention: two stages per step with tensor_parallel_size > 1 are not "
            'supported; set "num_stages": 1 on both roles'
        )

    def graph_capture(self) -> AbstractContextManager[None]:
        """No connector to prepare for a capture."""
        return nullcontext()

    def replay_step(self, num_tokens: int, replay: Callable[[], T]) -> T:
        """Run ``replay()``: the leader announces the replay."""
        return replay()

    def exchange(
        self, hidden: Any, router_logits: Any | None, layer: int, routing: Any | None = None
    ) -> Any:
        """The leader's result for ``layer``: a new tensor like ``hidden``, broadcast."""
        import torch

        out = self._broadcast(torch.empty_like(hidden, memory_format=torch.contiguous_format))
        self.exchanges += 1
        return out

    def exchange_experts(self, hidden: Any, topk_weights: Any, topk_ids: Any, layer: int) -> Any:
        """:meth:`exchange` of a MoE layer of an expert-routed deployment."""
        return self.exchange(hidden, None, layer)
