"""In-memory stand-ins for the role tests: tensors, a recording connector, FFN models.

No torch, no vLLM: a :class:`FakeTensor` has a shape and a dtype name; the
:class:`RecordingConnector` implements the :class:`~afd_core.connector.Connector` contract
in memory and records every call in ``events``.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from afd_core.config import AFDConfig
from afd_core.connector import Connector, ControlPlane, FFNLayerBatch, FFNStep, WireSpec
from afd_core.errors import AFDShutdown
from afd_core.metadata import ControlPayload, TransferHeader

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


def new_fake_output(hidden: FakeTensor) -> FakeTensor:
    """The ``new_output`` of a StepDriver under test: a fresh FakeTensor like ``hidden``."""
    return FakeTensor(hidden.shape, hidden.dtype)


def make_config(role: str = "attention", *, attention: int = 1, ffn: int = 1) -> AFDConfig:
    return AFDConfig(
        role=role,  # type: ignore[arg-type]
        connector="Recording",
        num_attention_ranks=attention,
        num_ffn_ranks=ffn,
    )


class _ControlPlane(ControlPlane):
    def __init__(self, owner: RecordingConnector) -> None:
        self._owner = owner

    def send_step(self, payload: ControlPayload) -> None:
        self._owner.events.append(("send_step", payload))

    def recv_step(self) -> FFNStep | None:
        # Polls the closed flag, as the Connector contract asks of blocking waits.
        while True:
            try:
                item = self._owner.steps.get(timeout=0.01)
                break
            except queue.Empty:
                if self._owner.is_closed:
                    return None
        if item is None:
            return None
        if isinstance(item, BaseException):
            raise item
        return item


class FakeStream:
    """Whether the "current CUDA stream" is capturing (``StepDriver(is_capturing=...)``)."""

    def __init__(self) -> None:
        self.capturing = False

    def is_capturing(self) -> bool:
        return self.capturing


class RecordingConnector(Connector):
    """A connector that records calls and serves queued FFN steps.

    FFN side: put :class:`FFNStep` objects (or an exception to raise) into ``steps``;
    ``recv_step`` blocks until one arrives and returns ``None`` for a queued ``None`` or
    once closed.
    ``fail_recv_hidden`` makes ``recv_hidden`` raise that exception.
    """

    name = "Recording"

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec = WIRE) -> None:
        super().__init__(config, role_rank, wire)
        self.events: list[tuple[Any, ...]] = []
        self.steps: queue.Queue[Any] = queue.Queue()
        self.fail_recv_hidden: BaseException | None = None
        self.closed_from: list[str] = []
        self._control = _ControlPlane(self)

    def _initialize(self) -> None:
        self.events.append(("initialize",))

    def _close(self) -> None:
        self.closed_from.append(threading.current_thread().name)

    @property
    def control_plane(self) -> ControlPlane:
        return self._control

    def send_hidden(
        self, header: TransferHeader, hidden: Any, router_logits: Any | None = None
    ) -> None:
        self.events.append(("send_hidden", header, hidden, router_logits))

    def recv_output(self, header: TransferHeader, out: Any) -> Any:
        self.events.append(("recv_output", header, out))
        return out

    def watch_graph_replay(self, step_id: int) -> None:
        self.events.append(("watch_graph_replay", step_id))

    @contextmanager
    def graph_capture(self) -> Iterator[None]:
        self.events.append(("graph_capture", "enter"))
        yield
        self.events.append(("graph_capture", "exit"))

    def recv_hidden(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        if self.fail_recv_hidden is not None:
            raise self.fail_recv_hidden
        if self.is_closed:
            raise AFDShutdown("closed")
        counts = step.stage_tokens(stage)
        self.events.append(("recv_hidden", step.payloads[0].step_id, layer, stage))
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=FakeTensor((sum(counts), self.wire.hidden_size)),
            router_logits=None,
            splits=counts,
            headers=(),
        )

    def send_output(self, batch: FFNLayerBatch, output: Any) -> None:
        self.events.append(("send_output", batch.step.payloads[0].step_id, batch.layer, output))

    def calls(self, kind: str) -> list[tuple[Any, ...]]:
        """The recorded events of one kind, without the kind."""
        return [event[1:] for event in self.events if event[0] == kind]


def ffn_step(step_id: int, *stage_tokens: int, attention_rank: int = 0) -> FFNStep:
    """An FFN step of one attention rank with ``stage_tokens[s]`` tokens in stage ``s``."""
    from afd_core.metadata import AFDDPMetadata

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
