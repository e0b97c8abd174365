"""The pairing of an attention endpoint's sends and results: :class:`InFlight`.

An attention endpoint keeps at most one exchange in flight per stage: ``send(layer,
stage)`` puts it there and ``recv(layer, stage)`` takes it out again. A call that breaks
the pairing (a second send of a stage before its receive, a receive of a stage with
nothing or another layer in flight) is an AFDProtocolError naming the rank, the layer and
the stage. afd-core's endpoints and a third party's use this one rule; the rule of a
step's exchanges in order is :class:`~afd_core.kit.step_exchanges.StepExchanges`.

Pure Python.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from afd_core.errors import AFDProtocolError

T = TypeVar("T")


class InFlight(Generic[T]):
    """The exchanges of one attention endpoint awaiting their results, by stage.

    ``prefix`` starts every error (e.g. ``"AFD"``, ``"AFD CAM P2P"``), ``role_rank`` is
    the endpoint's attention rank. Used from the threads of one endpoint's stages: each
    thread touches only its own stage's entry.
    """

    def __init__(self, prefix: str, role_rank: int) -> None:
        self._prefix = prefix
        self._role_rank = role_rank
        self._by_stage: dict[int, tuple[int, T]] = {}

    def __contains__(self, stage: object) -> bool:
        """True when ``stage`` has an exchange in flight."""
        return stage in self._by_stage

    def check_free(self, layer: int, stage: int) -> None:
        """Raise AFDProtocolError when ``stage`` still has an exchange in flight (a send
        of ``layer`` there would break the pairing)."""
        sent = self._by_stage.get(stage)
        if sent is not None:
            raise AFDProtocolError(
                f"{self._prefix}: attention rank {self._role_rank} sends layer {layer} stage "
                f"{stage} while layer {sent[0]} of that stage awaits recv(); call send() and "
                "recv() in pairs"
            )

    def put(self, layer: int, stage: int, exchange: T) -> None:
        """Keep ``exchange``, the send of ``layer`` in ``stage`` (:meth:`check_free` first)."""
        self.check_free(layer, stage)
        self._by_stage[stage] = (layer, exchange)

    def take(self, layer: int, stage: int) -> T:
        """Remove and return the exchange that ``recv(layer, stage)`` completes.

        Raises AFDProtocolError when that stage has nothing in flight or another layer.
        """
        sent = self._by_stage.pop(stage, None)
        if sent is None or sent[0] != layer:
            what = "nothing" if sent is None else f"layer {sent[0]}"
            raise AFDProtocolError(
                f"{self._prefix}: attention rank {self._role_rank} asks for the result of "
                f"layer {layer} stage {stage}, but sent {what} for that stage; call send() "
                "and recv() in pairs"
            )
        return sent[1]

    def clear(self) -> None:
        """Forget every exchange (a new step)."""
        self._by_stage.clear()
