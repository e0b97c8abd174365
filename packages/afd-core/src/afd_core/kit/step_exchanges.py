"""Every layer, every stage, once: the rule of one step's layer exchanges, kept in one place.

A step exchanges every layer of the wire spec (``exchange_layers``, in that order) in
every one of its stages, each exactly once. The connector's endpoints own the rule (the
endpoint contract, :mod:`afd_core.connector`, says they raise AFDProtocolError for
anything else); each keeps one :class:`StepExchanges` and asks it at every exchange.
Callers above the endpoint (the attention role's step driver) rely on it and count
nothing themselves. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from afd_core.errors import AFDProtocolError

if TYPE_CHECKING:
    from afd_core.wire.metadata import ControlPayload


class StepExchanges:
    """The layer exchanges of one step of one endpoint (see the module docstring).

    ``layers`` are the wire spec's exchange layers in call order; ``who`` names the
    endpoint in errors (``"attention rank 0"``). :meth:`begin` starts a step,
    :meth:`take` admits each layer of a stage in order and :meth:`finish` counts each
    finished exchange (its result received, or sent back).
    """

    __slots__ = ("_cursor", "_index", "_layers", "_who", "done", "expected", "step_id")

    def __init__(self, layers: tuple[int, ...], who: str) -> None:
        self._layers = layers
        self._index = {layer: i for i, layer in enumerate(layers)}
        self._who = who
        self._cursor: list[int] = []
        self.step_id: int | None = None
        #: Exchanges finished in the step, and how many it makes.
        self.done = 0
        self.expected = 0

    @property
    def complete(self) -> bool:
        """Whether the step made every exchange it makes (True before the first step)."""
        return self.done == self.expected

    def begin_announced(
        self, payload: ControlPayload, role_rank: int, *, exchanges: bool = True
    ) -> tuple[int, ...]:
        """Start the step ``payload`` announces, sent by attention rank ``role_rank``; its
        token count per stage.

        Raises AFDProtocolError when the payload is signed by another attention rank, or
        as :meth:`begin`.
        """
        if payload.sender_rank != role_rank:
            raise AFDProtocolError(
                f"AFD control: attention rank {role_rank} was asked to send a payload "
                f"signed by attention rank {payload.sender_rank}"
            )
        tokens = payload.tokens_of(role_rank)
        self.begin(payload.step_id, len(tokens), exchanges=exchanges)
        return tokens

    def begin(self, step_id: int, num_stages: int, *, exchanges: bool = True) -> None:
        """Start step ``step_id`` of ``num_stages`` stages; ``exchanges`` False for a step
        that makes no exchange through this endpoint (a CUDA graph replay).

        Raises AFDProtocolError while the previous step is incomplete.
        """
        if not self.complete:
            raise AFDProtocolError(
                f"AFD: {self._who} starts step {step_id} after {self.done} of the "
                f"{self.expected} layer exchanges of step {self.step_id} "
                f"({len(self._layers)} layers x {len(self._cursor)} stages); every step "
                "exchanges every layer in every stage once (a forward was interrupted, or "
                "the model skips layers)"
            )
        self.step_id = step_id
        self._cursor = [0] * num_stages if exchanges else []
        self.done = 0
        self.expected = num_stages * len(self._layers) if exchanges else 0

    def take(self, layer: int, stage: int) -> int:
        """Admit the exchange of ``layer`` in ``stage``: it must be that stage's next layer.

        Returns the exchange's row in the step (``stage * L + i``, ``L`` exchange layers,
        ``i`` the layer's index): where its headers are. Raises AFDProtocolError for a
        layer out of order or exchanged twice, an unknown layer or stage, or no step.
        """
        cursor = self._cursor
        if 0 <= stage < len(cursor):
            i = cursor[stage]
            if i < len(self._layers) and self._layers[i] == layer:
                cursor[stage] = i + 1
                return stage * len(self._layers) + i
        self._reject(layer, stage)
        raise AssertionError("unreachable: _reject raises")

    def finish(self) -> bool:
        """Count one finished exchange; True when it was the step's last."""
        self.done += 1
        return self.done == self.expected

    def _reject(self, layer: int, stage: int) -> None:
        """Raise AFDProtocolError saying why :meth:`take` refuses ``layer`` in ``stage``."""
        who, layers, step = self._who, self._layers, self.step_id
        if step is None:
            raise AFDProtocolError(
                f"AFD: {who} exchanges layer {layer} before any step began; call begin_step() first"
            )
        if layer not in self._index:
            raise AFDProtocolError(
                f"AFD: layer {layer} is not an exchange layer of the wire spec {layers}"
            )
        if not self._cursor:
            raise AFDProtocolError(
                f"AFD: {who} exchanges layer {layer} in step {step}, which makes no layer "
                "exchange through the endpoint (a CUDA graph replay); begin the next step first"
            )
        if not 0 <= stage < len(self._cursor):
            raise AFDProtocolError(
                f"AFD: stage {stage} is outside step {step}'s {len(self._cursor)} stage(s)"
            )
        i = self._cursor[stage]
        if i == len(layers):
            raise AFDProtocolError(
                f"AFD: {who} exchanges layer {layer} stage {stage} after step {step} "
                f"exchanged all its {len(layers)} layers in that stage; begin the next step first"
            )
        raise AFDProtocolError(
            f"AFD: {who} exchanged layer {layer} in stage {stage} of step {step} where "
            f"layer {layers[i]} (exchange {i + 1} of {len(layers)}) was expected; every "
            f"step exchanges the layers {layers} in this order, each once per stage"
        )
