"""In-memory stand-ins for the role tests: tensors, a recording connector, FFN models.

No torch, no vLLM: a :class:`FakeTensor` has a shape and a dtype name; the
:class:`RecordingConnector` implements the :class:`~afd_core.connector.Connector` contract
in memory (its endpoints record every call in the connector's ``events``; its attention
endpoint keeps the rule of a step's exchanges with afd-core's
:class:`~afd_core.kit.step_exchanges.StepExchanges`, as the contract asks of every endpoint).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from afd_core.assembly import P2pBlock
from afd_core.config import AFDConfig
from afd_core.connector import (
    AttentionEndpoint,
    Connector,
    ConnectorParts,
    ExpertRouting,
    FFNEndpoint,
    FFNLayerBatch,
    FFNStep,
    WireSpec,
)
from afd_core.errors import AFDShutdown
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.wire.metadata import ControlPayload

WIRE = WireSpec(hidden_size=8, dtype="bfloat16", num_exchange_layers=3)

_ids = itertools.count()


@dataclass(eq=False)
class FakeTensor:
    """A tensor stand-in: ``shape``, ``dtype`` (printed like torch's) and an identity."""

    shape: tuple[int, ...]
    dtype: str = "torch.bfloat16"
    tag: int = field(default_factory=lambda: next(_ids))
    device: str = "cpu"

    def contiguous(self) -> FakeTensor:
        return self

    def to(self, device: str) -> FakeTensor:
        """Itself on ``device``; a new tensor (a copy) when it lives elsewhere."""
        return self if device == self.device else FakeTensor(self.shape, self.dtype, device=device)


def make_config(role: str = "attention", *, attention: int = 1, ffn: int = 1) -> AFDConfig:
    return AFDConfig(
        role=role,  # type: ignore[arg-type]
        connector="Recording",
        num_attention_ranks=attention,
        num_ffn_ranks=ffn,
    )


class _RecordingAttention(AttentionEndpoint):
    def __init__(self, owner: RecordingConnector) -> None:
        self._owner = owner
        self._sent: dict[int, Any] = {}
        self._exchanges = StepExchanges(
            owner.wire.exchange_layers, f"attention rank {owner.role_rank}"
        )

    def begin_step(self, payload: ControlPayload) -> None:
        replay = payload.is_graph_step and not payload.is_graph_capturing
        self._exchanges.begin(payload.step_id, len(payload.stages), exchanges=not replay)
        self._owner.events.append(("begin_step", payload))

    def send(
        self,
        layer: int,
        stage: int,
        hidden: Any,
        *,
        router_logits: Any | None = None,
        routing: ExpertRouting | None = None,
    ) -> None:
        self._exchanges.take(layer, stage)
        self._owner.events.append(("send", layer, stage, hidden, router_logits, routing))
        self._sent[stage] = hidden

    def recv(self, layer: int, stage: int) -> Any:
        self._owner.events.append(("recv", layer, stage))
        self._exchanges.finish()
        hidden = self._sent.pop(stage)
        return FakeTensor(hidden.shape, hidden.dtype)

    def watch_graph_replay(self, step_id: int) -> None:
        self._owner.events.append(("watch_graph_replay", step_id))

    @contextmanager
    def graph_capture(self) -> Iterator[None]:
        self._owner.events.append(("graph_capture", "enter"))
        yield
        self._owner.events.append(("graph_capture", "exit"))


class _RecordingFFN(FFNEndpoint):
    def __init__(self, owner: RecordingConnector) -> None:
        self._owner = owner

    def next_step(self) -> FFNStep | None:
        # Polls the closed flag, as the contract asks of blocking waits.
        owner = self._owner
        while True:
            try:
                item = owner.steps.get(timeout=0.01)
                break
            except queue.Empty:
                if owner.is_closed:
                    return None
        if item is None:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        owner = self._owner
        if owner.fail_recv is not None:
            raise owner.fail_recv
        if owner.is_closed:
            raise AFDShutdown("closed")
        counts = step.stage_tokens(stage)
        owner.events.append(("ffn_recv", step.payloads[0].step_id, layer, stage))
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=FakeTensor((sum(counts), owner.wire.hidden_size)),
            splits=counts,
        )

    def send(self, batch: FFNLayerBatch, output: Any) -> None:
        self._owner.events.append(("ffn_send", batch.step.payloads[0].step_id, batch.layer, output))


class FakeStream:
    """Whether the "current CUDA stream" is capturing (``StepDriver(is_capturing=...)``)."""

    def __init__(self) -> None:
        self.capturing = False

    def is_capturing(self) -> bool:
        return self.capturing


class RecordingConnector(Connector):
    """A connector that records calls and serves queued FFN steps.

    FFN side: put :class:`FFNStep` objects (or an exception to raise) into ``steps``;
    ``ffn.next_step`` blocks until one arrives and returns ``None`` for a queued ``None``
    or once closed. ``fail_recv`` makes ``ffn.recv`` raise that exception. The attention
    role's endpoint is usable without ``initialize()`` (the role tests skip it).
    """

    name = "Recording"
    pattern_type = P2pBlock

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec = WIRE) -> None:
        super().__init__(config, role_rank, wire)
        self.events: list[tuple[Any, ...]] = []
        self.steps: queue.Queue[Any] = queue.Queue()
        self.fail_recv: BaseException | None = None
        self.closed_from: list[str] = []
        self._attention = _RecordingAttention(self)
        self._ffn = _RecordingFFN(self)

    def connect(self) -> ConnectorParts:
        self.events.append(("initialize",))
        endpoint = self._attention if self.config.role == "attention" else self._ffn
        return ConnectorParts(
            endpoint, (lambda: self.closed_from.append(threading.current_thread().name),)
        )

    @property
    def attention(self) -> AttentionEndpoint:
        return self._attention

    @property
    def ffn(self) -> FFNEndpoint:
        return self._ffn

    def calls(self, kind: str) -> list[tuple[Any, ...]]:
        """The recorded events of one kind, without the kind."""
        return [event[1:] for event in self.events if event[0] == kind]


def ffn_step(step_id: int, *stage_tokens: int, attention_rank: int = 0) -> FFNStep:
    """An FFN step of one attention rank with ``stage_tokens[s]`` tokens in stage ``s``."""
    from afd_core.wire.metadata import AFDDPMetadata

    payload = ControlPayload(
        step_id=step_id,
        sender_rank=attention_rank,
        stages=tuple(AFDDPMetadata(attention_rank, (n,)) for n in stage_tokens),
    )
    return FFNStep(
        payloads=(payload,), attention_ranks=(attention_rank,), tokens=(tuple(stage_tokens),)
    )


class FakeFFNModel:
    """An FFN model wrapper that records its calls and returns a tagged output."""

    def __init__(self, layers: tuple[int, ...] = (0, 1, 2), fail_at: int | None = None) -> None:
        self.layers = layers
        self.fail_at = fail_at
        self.calls: list[tuple[int, tuple[int, ...]]] = []

    def afd_exchange_layers(self) -> tuple[int, ...]:
        return self.layers

    def afd_compute_ffn(self, layer: int, hidden: Any, router_logits: Any | None) -> Any:
        if layer == self.fail_at:
            raise RuntimeError(f"expert kernel failed at layer {layer}")
        self.calls.append((layer, hidden.shape))
        return ("ffn", layer, hidden.shape)
