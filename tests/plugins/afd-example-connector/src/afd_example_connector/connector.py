"""ExampleLoopbackConnector: an in-process AFD connector, written as an example for authors.

Both roles live in the same Python process (threads, or one thread taking turns) and
exchange through in-memory queues instead of a network. That is useless for serving but
shows the whole connector contract of afd-core 0.3 in a few lines: strict
``connector_extra_config`` parsing, a ``connect()`` that checks both sides agree and
returns the role's endpoint, an endpoint that owns its wire format (it writes a header
for every message and checks every header it receives), bounded waits that wake up on
``close()``.

Endpoints meet on a channel keyed by the AFD config's ``host`` and ``port``. Headers carry
role ranks: an attention rank's messages name its attention rank, an FFN rank's name its
FFN rank. ``connector_extra_config`` takes one field, ``loopback_delay_ms`` (a sleep
before every data message, to imitate a network).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from afd_core.assembly import P2pBlock
from afd_core.config.coercion import reject_unknown_fields
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
from afd_core.errors import AFDConfigError, AFDPeerError, AFDProtocolError, AFDShutdown
from afd_core.wire.metadata import ControlPayload, TransferHeader

if TYPE_CHECKING:
    import torch

_POLL_S = 0.05


@dataclass(frozen=True)
class LoopbackExtra:
    """The parsed ``connector_extra_config`` of ExampleLoopbackConnector."""

    loopback_delay_ms: int = 0


@dataclass
class _Channel:
    """Queues shared by every endpoint of one (host, port); keys name the attention rank."""

    agreed: tuple[dict[str, Any], WireSpec] | None = None  # (shared settings, wire spec)
    users: int = 0
    queues: defaultdict[tuple[str, int], queue.Queue[Any]] = field(
        default_factory=lambda: defaultdict(queue.Queue)
    )


_channels: dict[tuple[str, int], _Channel] = {}
_channels_lock = threading.Lock()


class ExampleLoopbackConnector(Connector):
    """An AFD connector whose peers are other instances in the same process."""

    name = "ExampleLoopbackConnector"
    #: It builds its own parts, pairing ranks by afd-core's block rule.
    pattern_type = P2pBlock

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> LoopbackExtra:
        """Accept only ``loopback_delay_ms`` (an int >= 0); name any other field."""
        reject_unknown_fields(raw, ("loopback_delay_ms",), cls.name)
        delay = raw.get("loopback_delay_ms", 0)
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise AFDConfigError(
                f"AFD config: connector_extra_config.loopback_delay_ms must be an integer "
                f">= 0, got {delay!r}"
            )
        return LoopbackExtra(loopback_delay_ms=delay)

    def connect(self) -> ConnectorParts:
        """Join the channel; the first endpoint's view is what every later one must match.

        Extra configs are compared parsed, so ``{}`` and the defaults written out agree.
        """
        key = (self.config.host, self.config.port)
        mine = (self.config.shared_view() | {"connector_extra_config": self.extra}, self.wire)
        with _channels_lock:
            channel = _channels.setdefault(key, _Channel())
            if channel.agreed is None:
                channel.agreed = mine
            elif channel.agreed != mine:
                raise AFDProtocolError(
                    f"AFD {self.name}: {self.config.role} rank {self.role_rank} has config "
                    f"{mine}, the channel {key} agreed on {channel.agreed}; start both "
                    "roles with the same AFD config and model"
                )
            channel.users += 1
        wires = _Wires(self, channel)

        def leave() -> None:
            with _channels_lock:
                channel.users -= 1
                if channel.users == 0:
                    _channels.pop(key, None)

        role_endpoint = _Attention if self.config.role == "attention" else _FFN
        return ConnectorParts(role_endpoint(self, wires), (leave,))


class _Wires:
    """The queues of one endpoint: bounded waits that end when the connector closes."""

    def __init__(self, connector: ExampleLoopbackConnector, channel: _Channel) -> None:
        self.connector = connector
        self.channel = channel

    def put(self, key: tuple[str, int], item: Any) -> None:
        delay_ms = self.connector.extra.loopback_delay_ms
        if delay_ms:
            time.sleep(delay_ms / 1000)
        self.channel.queues[key].put(item)

    def get(self, key: tuple[str, int], *, forever: bool = False) -> Any:
        """The next item of ``key``; AFDShutdown once closed, AFDPeerError past the timeout."""
        timeout_s = self.connector.config.afd_process_group_timeout_s
        deadline = None if forever else time.monotonic() + timeout_s
        q = self.channel.queues[key]
        while True:
            self.connector.fuse.check()  # AFDShutdown once closed
            if deadline is not None and time.monotonic() > deadline:
                raise AFDPeerError(
                    f"AFD {self.connector.name}: nothing arrived on {key} within {timeout_s} s; "
                    "is the peer running?"
                )
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue


class _Attention(AttentionEndpoint):
    """Attention side: one queue to the FFN rank serving this rank, one back."""

    def __init__(self, connector: ExampleLoopbackConnector, wires: _Wires) -> None:
        self.connector, self.wires = connector, wires
        self.rank = connector.role_rank
        self.ffn_rank = connector.topology.ffn_rank_of(self.rank)
        self.step: ControlPayload | None = None

    def begin_step(self, payload: ControlPayload) -> None:
        """Announce the step: its payload travels as its versioned bytes."""
        self.step = payload
        self.wires.put(("ctrl", self.rank), payload.encode())

    def send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        *,
        router_logits: torch.Tensor | None = None,
        routing: ExpertRouting | None = None,
    ) -> None:
        """Queue one layer's input behind its header."""
        assert self.step is not None, "begin_step() first"
        header = _header(self.connector.wire, "a2f", self.step.step_id, layer, stage,
                         hidden.shape[0], self.rank)  # fmt: skip
        logits = None if router_logits is None else router_logits.clone()
        self.wires.put(("a2f", self.rank), (header.encode(), hidden.clone(), logits))

    def recv(self, layer: int, stage: int) -> torch.Tensor:
        """Wait for the FFN result of ``layer`` and ``stage``; check its header."""
        assert self.step is not None, "begin_step() first"
        data, output = self.wires.get(("f2a", self.rank))
        expected = _header(self.connector.wire, "f2a", self.step.step_id, layer, stage,
                           output.shape[0], self.ffn_rank)  # fmt: skip
        TransferHeader.decode(data).check(expected)
        return output


class _FFN(FFNEndpoint):
    """FFN side: the queues of every attention rank of this FFN rank's block."""

    def __init__(self, connector: ExampleLoopbackConnector, wires: _Wires) -> None:
        self.connector, self.wires = connector, wires
        self.block = connector.topology.block_of(connector.role_rank)

    def next_step(self) -> FFNStep | None:
        """Wait (as long as needed) for one payload from every attention rank of the block."""
        payloads: list[ControlPayload] = []
        try:
            first = self.wires.get(("ctrl", self.block[0]), forever=True)
            payloads.append(ControlPayload.decode(first))
            for rank in self.block[1:]:
                payloads.append(ControlPayload.decode(self.wires.get(("ctrl", rank))))
        except AFDShutdown:
            return None
        return FFNStep(
            payloads=tuple(payloads),
            attention_ranks=tuple(self.block),
            tokens=tuple(p.tokens_of(r) for p, r in zip(payloads, self.block, strict=True)),
        )

    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """Collect one layer's input from every attention rank of ``step``, concatenated."""
        import torch

        wire = self.connector.wire
        hiddens, logits = [], []
        for payload, rank, counts in zip(step.payloads, step.attention_ranks, step.tokens,
                                         strict=True):  # fmt: skip
            data, hidden, rank_logits = self.wires.get(("a2f", rank))
            expected = _header(wire, "a2f", payload.step_id, layer, stage, counts[stage], rank)
            TransferHeader.decode(data).check(expected)
            hiddens.append(hidden)
            logits.append(rank_logits)
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=torch.cat(hiddens),
            splits=step.stage_tokens(stage),
            router_logits=torch.cat(logits) if wire.logits_width_at(layer) else None,
        )

    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Split ``output`` by ``batch.splits`` and queue each part behind its header."""
        wire, parts = self.connector.wire, output.split(list(batch.splits))
        for payload, rank, part in zip(batch.step.payloads, batch.step.attention_ranks, parts,
                                       strict=True):  # fmt: skip
            header = _header(wire, "f2a", payload.step_id, batch.layer, batch.stage,
                             part.shape[0], self.connector.role_rank)  # fmt: skip
            self.wires.put(("f2a", rank), (header.encode(), part.clone()))


def _header(
    wire: WireSpec, direction: str, step_id: int, layer: int, stage: int, rows: int, sender: int
) -> TransferHeader:
    width = wire.logits_width_at(layer) if direction == "a2f" else 0
    return TransferHeader(
        direction=direction,
        step_id=step_id,
        layer=layer,
        stage=stage,
        num_tokens=rows,
        dtype=wire.dtype,
        hidden_size=wire.hidden_size,
        sender_rank=sender,
        logits_width=width,
        logits_dtype=wire.router_logits_dtype if width else "float32",
    )
