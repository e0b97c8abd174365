"""The pairing of an attention endpoint's sends and results: :class:`InFlight`.

``send(layer, stage)`` puts an exchange in flight on its stage and ``recv(layer, stage)``
takes the stage's oldest one out again, so each result pairs with its own send. An
endpoint whose receive follows its send (afd-core's patterns, CAM P2P) keeps at most one
exchange in flight per stage (``depth`` 1); one whose receive is deferred (CAM async:
every MoE layer dispatched before the first combine) keeps any number, in order
(``depth`` None). A call that breaks the pairing (a send of a full stage, a receive of a
stage with nothing or another layer first) is an AFDProtocolError naming the rank, the
layer and the stage. afd-core's endpoints and a third party's use this one rule; the rule
of a step's exchanges in order is :class:`~afd_core.kit.step_exchanges.StepExchanges`.

Pure Python.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from afd_core.errors import AFDProtocolError

T = TypeVar("T")


class InFlight(Generic[T]):
    """The exchanges of one attention endpoint awaiting their results, by stage.

    ``prefix`` starts every error (e.g. ``"AFD"``, ``"AFD CAM P2P"``), ``role_rank`` is
    the endpoint's attention rank, ``depth`` the exchanges a stage may have in flight
    (None: any number). Used from the threads of one endpoint's stages: each thread
    touches only its own stage's entry.
    """

    def __init__(self, prefix: str, role_rank: int, *, depth: int | None = 1) -> None:
        self._prefix = prefix
        self._role_rank = role_rank
        self._depth = depth
        self._by_stage: dict[int, deque[tuple[int, T]]] = {}

    def __contains__(self, stage: object) -> bool:
        """True when ``stage`` has an exchange in flight."""
        return bool(self._by_stage.get(stage))  # type: ignore[call-overload]

    def check_free(self, layer: int, stage: int) -> None:
        """Raise AFDProtocolError when ``stage`` has ``depth`` exchanges in flight (a send
        of ``layer`` there would break the pairing)."""
        sent = self._by_stage.get(stage)
        if sent and self._depth is not None and len(sent) >= self._depth:
            raise AFDProtocolError(
                f"{self._prefix}: attention rank {self._role_rank} sends layer {layer} stage "
                f"{stage} while layer {sent[0][0]} of that stage awaits recv(); call send() "
                "and recv() in pairs"
            )

    def put(self, layer: int, stage: int, exchange: T) -> None:
        """Keep ``exchange``, the send of ``layer`` in ``stage`` (:meth:`check_free` first)."""
        self.check_free(layer, stage)
        self._by_stage.setdefault(stage, deque()).append((layer, exchange))

    def take(self, layer: int, stage: int) -> T:
        """Remove and return the exchange that ``recv(layer, stage)`` completes: the
        stage's oldest.

        Raises AFDProtocolError when that stage has nothing in flight or another layer
        first.
        """
        sent = self._by_stage.get(stage)
        if not sent or sent[0][0] != layer:
            what = "nothing" if not sent else f"layer {sent[0][0]} first"
            raise AFDProtocolError(
                f"{self._prefix}: attention rank {self._role_rank} asks for the result of "
                f"layer {layer} stage {stage}, but sent {what} for that stage; receive "
                "each send once, in order"
            )
        return sent.popleft()[1]

    def clear(self) -> None:
        """Forget every exchange (a new step)."""
        self._by_stage.clear()
