"""``ExpertFFNEndpoint``: the FFN side of the expert-routed M:N exchange.

An FFN rank holds one block of routed experts (:mod:`afd_core.expert.placement`) and
takes its steps from the :class:`~afd_core.control.relay.StepRelay` (every FFN rank runs
the same steps). Per MoE layer and stage it receives, from every attention rank of the
step, a header whose ``num_tokens`` is the number of rows routed to it and, unless that
is 0, a body with those rows (:mod:`afd_core.expert.messages`); it hands the FFN model
the rows of all attention ranks concatenated with their routing in local expert ids
(:func:`~afd_core.expert.routing.localize`), and sends every attention rank a header and
the partial result of its rows.

Receiving a body whose size only its header tells: on a transport that accepts a short
message into a larger receive (gloo) header and body are one message, received into
room for every token the sender has in the stage, so no handshake is added; otherwise
(NCCL) the header is a message of its own, read first, then the exact body is received.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.connector import ExpertRouting, FFNEndpoint, FFNLayerBatch, FFNStep
from afd_core.control.relay import StepRelay
from afd_core.endpoint_context import EndpointContext
from afd_core.errors import AFDProtocolError
from afd_core.expert.messages import body_bytes, unpack_body
from afd_core.expert.routing import localize
from afd_core.failures import guarded, guarded_until_closed, layer_of_step
from afd_core.metadata import TransferHeader
from afd_core.transport import TransferFailed
from afd_core.wire import HEADER_BYTES, HeaderCodec, raise_header_mismatch

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch


@dataclass(slots=True)
class _Source:
    """One attention rank of a layer: its routed rows and where they came from."""

    rank: int
    peer: int
    step_id: int
    rows: int
    offset: int


@dataclass
class ReceivedRows:
    """Rows this FFN rank received per layer since it started (every one of them has at
    least one of its experts: :func:`~afd_core.expert.routing.localize` refuses others)."""

    rows: dict[int, int]


class ExpertFFNEndpoint(FFNEndpoint):
    """The FFN side of the expert-routed exchange (see the module docstring).

    ``senders`` maps every attention rank to its world rank; ``block`` is this rank's
    experts (global ids).
    """

    def __init__(
        self,
        context: EndpointContext,
        *,
        block: range,
        senders: Mapping[int, int],
        relay: StepRelay,
    ) -> None:
        import torch

        wire = context.wire
        self._torch = torch
        self._wire, self._role_rank, self._transport = wire, context.role_rank, context.transport
        self._fuse, self._failures, self._timeout_s = (
            context.fuse, context.failures, context.timeout_s
        )  # fmt: skip
        self._block = block
        self._senders = dict(senders)
        self._relay = relay
        self._dtype = getattr(torch, wire.dtype)
        self._layers = wire.exchange_layers
        self._codec = HeaderCodec(wire)
        self._bodies: dict[tuple[int, int], torch.Tensor] = {}
        self._sources: dict[int, list[_Source]] = {}
        self.received = ReceivedRows({})

    @property
    def block(self) -> range:
        """The global ids of the experts this FFN rank holds."""
        return self._block

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        return self._relay.next_step()

    @guarded
    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        if layer not in self._layers:
            raise AFDProtocolError(
                f"AFD: layer {layer} is not an exchange (MoE) layer of the wire spec {self._layers}"
            )
        torch, transport, wire = self._torch, self._transport, self._wire
        deadline = time.monotonic() + self._timeout_s
        inline = transport.accepts_short_messages
        messages, transfers = [], []
        try:
            for rank, counts in zip(step.attention_ranks, step.tokens, strict=True):
                if inline:  # header and body in one message, room for every token
                    room = HEADER_BYTES + body_bytes(counts[stage], wire)
                    message = self._body(rank, stage, room)
                else:
                    message = torch.zeros(HEADER_BYTES, dtype=torch.uint8, device=transport.device)
                messages.append(message)
                transfers.append(transport.post_recv(message, self._senders[rank]))
            transport.wait_all(transfers, deadline)
            sources, parts, offset = [], [], 0
            for rank, payload, counts, message in zip(
                step.attention_ranks, step.payloads, step.tokens, messages, strict=True
            ):
                rows = self._check_header(message[:HEADER_BYTES], rank, payload.step_id, layer,
                                          stage, counts[stage])  # fmt: skip
                sources.append(_Source(rank, self._senders[rank], payload.step_id, rows, offset))
                offset += rows
                if not rows:
                    continue
                nbytes = body_bytes(rows, wire)
                if inline:
                    body = message[HEADER_BYTES : HEADER_BYTES + nbytes]
                else:  # exact sizes: the body's receive follows its header
                    body = self._body(rank, stage, nbytes)
                    transport.wait(transport.post_recv(body, self._senders[rank]), deadline)
                    transport.synchronize(deadline)
                parts.append(unpack_body(body, rows, wire))
        except TransferFailed as exc:
            raise self._failures.error(
                exc, layer_of_step(layer, step.payloads[0].step_id)
            ) from None
        hidden, ids, weights = self._concat(parts)
        local_ids, local_weights = localize(ids, weights, self._block)
        self._sources[stage] = sources
        self.received.rows[layer] = self.received.rows.get(layer, 0) + offset
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=hidden,
            splits=tuple(s.rows for s in sources),
            routing=ExpertRouting(local_ids, local_weights),
        )

    @guarded
    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        sources = self._sources.pop(batch.stage, None)
        if sources is None:
            raise AFDProtocolError(
                f"AFD: FFN rank {self._role_rank} sends layer {batch.layer} stage {batch.stage} "
                "without having received it; call recv() and send() in pairs"
            )
        rows = sum(s.rows for s in sources)
        size = self._wire.hidden_size
        if output.shape != (rows, size) or output.dtype != self._dtype:
            raise AFDProtocolError(
                f"AFD: output is {tuple(output.shape)} {output.dtype}, the routed rows say "
                f"({rows}, {size}) {self._dtype}"
            )
        transport = self._transport
        if output.device != transport.device:
            output = output.to(transport.device)
        transfers = []
        try:
            for source in sources:
                header = self._reply_header(source, batch.layer, batch.stage)
                transfers.append(transport.post_send(header, source.peer))
                if source.rows:
                    part = output[source.offset : source.offset + source.rows]
                    transfers.append(transport.post_send(part, source.peer))
            deadline = time.monotonic() + self._timeout_s
            transport.wait_all(transfers, deadline)
            transport.synchronize(deadline)
        except TransferFailed as exc:
            doing = layer_of_step(batch.layer, sources[0].step_id)
            raise self._failures.error(exc, doing) from None

    def stats(self) -> dict[str, object]:
        """``{"expert_block": [first, last + 1], "received_rows": {layer: rows}}``."""
        return {
            "expert_block": [self._block.start, self._block.stop],
            "received_rows": dict(self.received.rows),
        }

    def _check_header(
        self, header: torch.Tensor, rank: int, step_id: int, layer: int, stage: int, room: int
    ) -> int:
        """The routed row count a received header announces, after checking the rest."""
        raw = bytes(self._transport.to_host(header).tolist())
        received = TransferHeader.decode(raw)
        expected = self._codec.header("a2f", step_id, layer, stage, received.num_tokens, rank,
                                      topk=self._wire.top_k)  # fmt: skip
        sender = self._failures.describe(self._senders[rank])
        raise_header_mismatch(raw, expected, sender)
        if received.num_tokens > room:
            raise AFDProtocolError(
                f"AFD data: {sender} routed {received.num_tokens} rows of layer {layer} to FFN "
                f"rank {self._role_rank}, more than its {room} tokens of step {step_id} stage "
                f"{stage}"
            )
        return received.num_tokens

    def _reply_header(self, source: _Source, layer: int, stage: int) -> torch.Tensor:
        torch = self._torch
        host = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        view = memoryview((ctypes.c_char * HEADER_BYTES).from_address(host.data_ptr())).cast("B")
        self._codec.pack_into(view, 0, "f2a", source.step_id, layer, stage, source.rows,
                              self._role_rank)  # fmt: skip
        return self._transport.to_device(host)

    def _body(self, rank: int, stage: int, nbytes: int) -> torch.Tensor:
        """The receive buffer of ``rank``'s bodies in ``stage`` (grown when too small)."""
        key = (rank, stage)
        body = self._bodies.get(key)
        if body is None or body.numel() < nbytes:
            body = self._bodies[key] = self._transport.allocate(max(nbytes, 4096))
        return body[:nbytes]

    def _concat(
        self, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torch, wire, device = self._torch, self._wire, self._transport.device
        if len(parts) == 1:
            return parts[0]
        if not parts:
            k = wire.top_k
            return (
                torch.empty((0, wire.hidden_size), dtype=self._dtype, device=device),
                torch.empty((0, k), dtype=torch.int32, device=device),
                torch.empty((0, k), dtype=torch.float32, device=device),
            )
        return tuple(torch.cat([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]
