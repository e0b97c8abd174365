"""ExampleLoopbackConnector: an in-process AFD connector, written as an example for authors.

Both roles live in the same Python process (threads, or one thread taking turns) and
exchange through in-memory queues instead of a network. That is useless for serving but
shows the whole connector contract in a few lines: strict ``connector_extra_config``
parsing, a rendezvous that checks both sides agree, the control plane, header checks on
every data message, bounded waits that wake up on :meth:`close`.

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

from afd_core.connector import Connector, ControlPlane, FFNLayerBatch, FFNStep, WireSpec
from afd_core.errors import AFDConfigError, AFDPeerError, AFDProtocolError, AFDShutdown
from afd_core.metadata import ControlPayload, TransferHeader

if TYPE_CHECKING:
    import torch

    from afd_core.config import AFDConfig

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

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        super().__init__(config, role_rank, wire)
        self._key = (config.host, config.port)
        self._channel: _Channel | None = None
        self._control = _LoopbackControlPlane(self)

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> LoopbackExtra:
        """Accept only ``loopback_delay_ms`` (an int >= 0); name any other field."""
        unknown = sorted(set(raw) - {"loopback_delay_ms"})
        if unknown:
            raise AFDConfigError(
                f"AFD config: connector_extra_config has unknown fields {unknown} for "
                f"{cls.name}; it accepts only loopback_delay_ms"
            )
        delay = raw.get("loopback_delay_ms", 0)
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise AFDConfigError(
                f"AFD config: connector_extra_config.loopback_delay_ms must be an integer "
                f">= 0, got {delay!r}"
            )
        return LoopbackExtra(loopback_delay_ms=delay)

    # Life cycle --------------------------------------------------------------------------

    def _initialize(self) -> None:
        """Join the channel; the first endpoint's view is what every later one must match.

        Extra configs are compared parsed, so ``{}`` and the defaults written out agree.
        """
        mine = (self.config.shared_view() | {"connector_extra_config": self.extra}, self.wire)
        with _channels_lock:
            channel = _channels.setdefault(self._key, _Channel())
            if channel.agreed is None:
                channel.agreed = mine
            elif channel.agreed != mine:
                raise AFDProtocolError(
                    f"AFD {self.name}: {self.config.role} rank {self.role_rank} has config "
                    f"{mine}, the channel {self._key} agreed on {channel.agreed}; start both "
                    "roles with the same AFD config and model"
                )
            channel.users += 1
        self._channel = channel

    def _close(self) -> None:
        if self._channel is None:
            return
        with _channels_lock:
            self._channel.users -= 1
            if self._channel.users == 0:
                _channels.pop(self._key, None)
        self._channel = None

    @property
    def control_plane(self) -> ControlPlane:
        """The control channel (attention ranks -> the FFN rank serving them)."""
        return self._control

    # Attention side ----------------------------------------------------------------------

    def send_hidden(
        self,
        header: TransferHeader,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None = None,
    ) -> None:
        """Queue one layer's input for the FFN rank serving this attention rank."""
        if hidden.shape[0] != header.num_tokens:
            raise AFDProtocolError(
                f"AFD {self.name}: header announces {header.num_tokens} tokens, the hidden "
                f"states have {hidden.shape[0]}"
            )
        logits = None if router_logits is None else router_logits.clone()
        self._put(("a2f", self.role_rank), (header.encode(), hidden.clone(), logits))

    def recv_output(self, header: TransferHeader, out: torch.Tensor) -> torch.Tensor:
        """Wait for the FFN result of ``header``'s layer and stage and copy it into ``out``."""
        data, output = self._get(("f2a", self.role_rank), deadline=self._deadline())
        TransferHeader.decode(data).check(header)
        return out.copy_(output)

    # FFN side ----------------------------------------------------------------------------

    def recv_hidden(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """Collect one layer's input from every attention rank of ``step``, concatenated."""
        import torch

        deadline = self._deadline()
        headers, hiddens, logits = [], [], []
        for i, rank in enumerate(step.attention_ranks):
            data, hidden, rank_logits = self._get(("a2f", rank), deadline=deadline)
            expected = TransferHeader(
                direction="a2f",
                step_id=step.payloads[i].step_id,
                layer=layer,
                stage=stage,
                num_tokens=step.tokens[i][stage],
                dtype=self.wire.dtype,
                hidden_size=self.wire.hidden_size,
                sender_rank=rank,
                logits_width=self.wire.router_logits_width,
                logits_dtype=self.wire.router_logits_dtype,
            )
            received = TransferHeader.decode(data)
            received.check(expected)
            headers.append(received)
            hiddens.append(hidden)
            logits.append(rank_logits)
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=torch.cat(hiddens),
            router_logits=torch.cat(logits) if self.wire.router_logits_width else None,
            splits=step.stage_tokens(stage),
            headers=tuple(headers),
        )

    def send_output(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Split ``output`` by ``batch.splits`` and queue each part for its attention rank."""
        parts = output.split(list(batch.splits))
        for rank, part, received in zip(
            batch.step.attention_ranks, parts, batch.headers, strict=True
        ):
            header = TransferHeader(
                direction="f2a",
                step_id=received.step_id,
                layer=batch.layer,
                stage=batch.stage,
                num_tokens=part.shape[0],
                dtype=self.wire.dtype,
                hidden_size=self.wire.hidden_size,
                sender_rank=self.role_rank,
            )
            self._put(("f2a", rank), (header.encode(), part.clone()))

    # Plumbing ----------------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self.config.afd_process_group_timeout_s

    def _queue(self, key: tuple[str, int]) -> queue.Queue[Any]:
        if self.is_closed:
            raise AFDShutdown(f"AFD {self.name}: closed")
        if self._channel is None:
            raise RuntimeError(f"{self.name}: call initialize() before exchanging data")
        return self._channel.queues[key]

    def _put(self, key: tuple[str, int], item: Any) -> None:
        if self.extra.loopback_delay_ms:
            time.sleep(self.extra.loopback_delay_ms / 1000)
        self._queue(key).put(item)

    def _get(self, key: tuple[str, int], deadline: float | None) -> Any:
        """Wait for the next item of ``key``; AFDShutdown on close, AFDPeerError on timeout."""
        q = self._queue(key)
        while True:
            if self.is_closed:
                raise AFDShutdown(f"AFD {self.name}: closed while waiting for {key}")
            if deadline is not None and time.monotonic() > deadline:
                raise AFDPeerError(
                    f"AFD {self.name}: nothing arrived on {key} within "
                    f"{self.config.afd_process_group_timeout_s} s; is the peer running?"
                )
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue


class _LoopbackControlPlane(ControlPlane):
    """Control payloads travel as their versioned bytes, like on a real wire."""

    def __init__(self, connector: ExampleLoopbackConnector) -> None:
        self._conn = connector

    def send_step(self, payload: ControlPayload) -> None:
        """Queue this step's payload for the FFN rank serving this attention rank."""
        self._conn._put(("ctrl", self._conn.role_rank), payload.encode())

    def recv_step(self) -> FFNStep | None:
        """Wait (as long as needed) for one payload from every attention rank of the block."""
        conn = self._conn
        block = conn.topology.block_of(conn.role_rank)
        payloads: list[ControlPayload] = []
        try:
            first = conn._get(("ctrl", block[0]), deadline=None)
            payloads.append(ControlPayload.decode(first))
            deadline = conn._deadline()
            for rank in block[1:]:
                payloads.append(ControlPayload.decode(conn._get(("ctrl", rank), deadline)))
        except AFDShutdown:
            return None
        return FFNStep(
            payloads=tuple(payloads),
            attention_ranks=tuple(block),
            tokens=tuple(p.tokens_of(rank) for p, rank in zip(payloads, block, strict=True)),
        )
