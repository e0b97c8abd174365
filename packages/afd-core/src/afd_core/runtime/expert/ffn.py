"""``ExpertFFNEndpoint``: the FFN side of the expert-routed M:N exchange.

An FFN rank holds one block of routed experts (:mod:`afd_core.placement`) and
takes its steps from a step relay (:mod:`afd_core.runtime.control.relay`: every FFN rank runs
the same steps). Per MoE layer and stage it receives, from every attention rank of the
step, a header whose ``num_tokens`` is the number of rows routed to it and, unless that
is 0, a body with those rows (:mod:`afd_core.runtime.expert.messages`); it hands the FFN model
the rows of all attention ranks concatenated with their routing in local expert ids
(:func:`~afd_core.runtime.expert.routing.localize`), and sends every attention rank one
frame: a header and the partial result of its rows (:mod:`afd_core.runtime.messages.frames`).

Each attention rank's messages travel on its link (:mod:`afd_core.runtime.links`: one world
shared by every rank, or a world of its own per pair on gloo). A lost replaceable link
drops out of the layer in flight: its rows are empty on this FFN rank and it is sent
nothing, while the other attention ranks of the step are served as usual.

Receiving a body whose size only its header tells: on a transport that accepts a short
message into a larger receive (gloo) header and body are one frame, received into room
for every token the sender has in the stage, so no handshake is added; otherwise (NCCL)
the header is a message of its own, read first, then the exact body is received. Headers
are written and checked by :class:`~afd_core.wire.headers.HeaderWriter`; the
rule "every layer, every stage, once" is the endpoint's
(:class:`~afd_core.kit.step_exchanges.StepExchanges`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.connector import ExpertRouting, FFNEndpoint, FFNLayerBatch, FFNStep
from afd_core.dataplane.transport import Transfer, TransferFailed
from afd_core.errors import AFDProtocolError
from afd_core.failures import guarded, guarded_until_closed, layer_of_step
from afd_core.kit.endpoint_context import EndpointContext
from afd_core.kit.peer_links import loss_record
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.runtime.expert.messages import body_bytes, unpack_body
from afd_core.runtime.expert.routing import localize
from afd_core.runtime.messages.frames import FrameLayout, frame_rows
from afd_core.wire import HEADER_BYTES, headers

if TYPE_CHECKING:
    import torch

    from afd_core.kit.peer_links import AttentionLink, FFNLinks
    from afd_core.runtime.control.relay import RelayedStep, StepSource


@dataclass(slots=True)
class _Source:
    """One attention rank of a layer: its link (None: absent here), routed rows and
    where they lie in the layer's input."""

    rank: int
    link: AttentionLink | None
    step_id: int
    rows: int
    offset: int


@dataclass
class ReceivedRows:
    """Rows this FFN rank received per layer since it started (every one of them has at
    least one of its experts: :func:`~afd_core.runtime.expert.routing.localize` refuses others)."""

    rows: dict[int, int]


class ExpertFFNEndpoint(FFNEndpoint):
    """The FFN side of the expert-routed exchange (see the module docstring).

    ``links`` reach every attention rank; ``block`` is this rank's experts (global ids);
    ``relay`` gives the steps and the link of each rank of a step.
    """

    def __init__(
        self,
        context: EndpointContext,
        *,
        block: range,
        links: FFNLinks,
        relay: StepSource,
        partials: str | None = None,
    ) -> None:
        import torch

        wire = context.wire
        self._torch = torch
        self._wire, self._role_rank, self._transport = wire, context.role_rank, context.transport
        self._fuse, self._failures, self._timeout_s = (
            context.fuse, context.failures, context.timeout_s
        )  # fmt: skip
        self._block = block
        self._links = links
        self._relay = relay
        self._step: RelayedStep | None = None
        self._dtype = getattr(torch, wire.dtype)
        #: The wire dtype of this rank's partial results (afd_core.config.partials).
        self._partials = partials or wire.dtype
        self._partials_dtype = getattr(torch, self._partials)
        self._layers = wire.exchange_layers
        self._exchanges = StepExchanges(self._layers, f"FFN rank {self._role_rank}")
        self._header_writer = headers.HeaderWriter(wire)
        self._bodies: dict[tuple[int, int], torch.Tensor] = {}
        self._replies = headers.HeaderedBuffers(context.transport)
        self._sources: dict[int, list[_Source]] = {}
        self.received = ReceivedRows({})

    @property
    def block(self) -> range:
        """The global ids of the experts this FFN rank holds."""
        return self._block

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        relayed = self._relay.next_step()
        if relayed is not None:
            step = relayed.step
            self._exchanges.begin(step.payloads[0].step_id, step.num_stages)
        self._step = relayed
        return None if relayed is None else relayed.step

    @guarded
    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        relayed = self._step
        if relayed is None or relayed.step is not step:
            raise AFDProtocolError(
                f"AFD: FFN rank {self._role_rank} received a step its next_step() did not give"
            )
        self._exchanges.take(layer, stage)
        deadline = time.monotonic() + self._timeout_s
        inline = self._transport.accepts_short_messages
        posted: list[tuple[_Source, torch.Tensor | None, list[Transfer]]] = []
        for rank, payload, counts, link in zip(
            step.attention_ranks, step.payloads, step.tokens, relayed.links, strict=True
        ):
            source = _Source(rank, link, payload.step_id, 0, 0)
            if link is None or link.lost is not None:
                posted.append((source, None, []))
                continue
            if inline:  # header and body in one message, room for every token
                room = HEADER_BYTES + body_bytes(counts[stage], self._wire)
                message = self._body(rank, stage, room)
            else:
                message = self._torch.zeros(HEADER_BYTES, dtype=self._torch.uint8,
                                            device=self._transport.device)  # fmt: skip
            transfers = self._post(source, layer, [message], receive=True)
            posted.append((source, message, transfers))
        sources, parts, offset = [], [], 0
        for (source, message, transfers), counts in zip(posted, step.tokens, strict=True):
            if message is not None and self._wait(source, transfers, layer, deadline):
                link = source.link
                assert link is not None
                source.rows = self._check_header(message, link, source.step_id, layer, stage,
                                                 counts[stage])  # fmt: skip
            if message is not None and source.rows:
                part = self._body_of(source, message, stage, layer, deadline, inline)
                if part is None:
                    source.rows = 0
                else:
                    parts.append(part)
            source.offset = offset
            offset += source.rows
            sources.append(source)
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
        if output.shape != (rows, size) or output.dtype != self._partials_dtype:
            raise AFDProtocolError(
                f"AFD: output is {tuple(output.shape)} {output.dtype}, the routed rows and "
                f"partials_dtype say ({rows}, {size}) {self._partials_dtype}"
            )
        if output.device != self._transport.device:
            output = output.to(self._transport.device)
        posted = []
        for source in sources:
            link = source.link
            if link is None or link.lost is not None:
                continue
            reply = self._reply(source, batch.layer, batch.stage, output)
            posted.append((source, self._post(source, batch.layer, [reply], receive=False)))
        deadline = time.monotonic() + self._timeout_s
        for source, transfers in posted:
            self._wait(source, transfers, batch.layer, deadline)
        self._exchanges.finish()
        for transport in {id(s.link.data): s.link.data for s, _ in posted if s.link}.values():
            try:
                transport.synchronize(deadline)
            except TransferFailed as exc:
                doing = layer_of_step(batch.layer, sources[0].step_id)
                raise self._failures.error(exc, doing) from None

    def stats(self) -> dict[str, object]:
        """``{"expert_block": [first, last + 1], "received_rows": {layer: rows},
        "linked_attention_ranks": [...], "attention_replacements": n,
        "last_peer_loss": {"error", "unix_time"} | None}``."""
        linked = sorted(r for r, link in self._links.current().items() if link.lost is None)
        return {
            "expert_block": [self._block.start, self._block.stop],
            "received_rows": dict(self.received.rows),
            "linked_attention_ranks": linked,
            "attention_replacements": self._links.replacements,
            "last_peer_loss": loss_record(self._links.last_loss),
        }

    # Transfers -------------------------------------------------------------------------

    def _post(
        self, source: _Source, layer: int, tensors: list[torch.Tensor], *, receive: bool
    ) -> list[Transfer]:
        """Post a receive (or a send) of each of ``tensors`` on ``source``'s link; a link
        that fails is lost (:meth:`_lose`)."""
        link = source.link
        assert link is not None
        post = link.data.post_recv if receive else link.data.post_send
        try:
            return [post(tensor, link.peer) for tensor in tensors]
        except TransferFailed as exc:
            self._lose(source, exc, layer)
            return []

    def _wait(
        self, source: _Source, transfers: list[Transfer], layer: int, deadline: float
    ) -> bool:
        """Wait for ``transfers`` of ``source``'s link; False when the link was lost."""
        link = source.link
        if link is None or link.lost is not None:
            return False
        try:
            link.data.wait_all(transfers, deadline)
        except TransferFailed as exc:
            self._lose(source, exc, layer)
            return False
        return True

    def _lose(self, source: _Source, failure: TransferFailed, layer: int) -> None:
        """A transfer of ``source`` failed: its rank drops out of the layer when the links
        let its link go (no rows here, nothing sent back), else raise the error."""
        assert source.link is not None
        self._links.lose_transfer(source.link, failure, layer_of_step(layer, source.step_id))
        source.rows = 0

    def _body_of(
        self,
        source: _Source,
        message: torch.Tensor,
        stage: int,
        layer: int,
        deadline: float,
        inline: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``source``'s routed rows: in ``message`` (inline) or received now (exact sizes);
        None when its link was lost meanwhile."""
        nbytes = body_bytes(source.rows, self._wire)
        if inline:
            body = message[HEADER_BYTES : HEADER_BYTES + nbytes]
        else:  # exact sizes: the body's receive follows its header
            link = source.link
            assert link is not None
            body = self._body(source.rank, stage, nbytes)
            transfers = self._post(source, layer, [body], receive=True)
            if not self._wait(source, transfers, layer, deadline):
                return None
            try:
                link.data.synchronize(deadline)
            except TransferFailed as exc:
                self._lose(source, exc, layer)
                return None
        return unpack_body(body, source.rows, self._wire)

    def _check_header(
        self,
        message: torch.Tensor,
        link: AttentionLink,
        step_id: int,
        layer: int,
        stage: int,
        room: int,
    ) -> int:
        """The routed row count the header of a received ``message`` announces, after
        checking the rest."""
        raw = headers.read_header(self._transport, message)
        rows = self._header_writer.num_tokens_of(raw)
        expected = headers.MessageHeader("a2f", step_id, layer, stage, rows, link.rank,
                                 topk=self._wire.top_k)  # fmt: skip
        self._header_writer.expect(raw, link.name, expected)
        if rows > room:
            raise AFDProtocolError(
                f"AFD data: {link.name} routed {rows} rows of layer {layer} to FFN rank "
                f"{self._role_rank}, more than its {room} tokens of step {step_id} stage {stage}"
            )
        return rows

    def _reply(self, source: _Source, layer: int, stage: int, output: torch.Tensor) -> torch.Tensor:
        """``source``'s reply: a frame of the header, then its rows of ``output``."""
        layout = FrameLayout.of(self._wire, source.rows, self._partials)
        buffer = self._replies.get((source.rank, stage), layout.size)
        header = headers.MessageHeader(
            "f2a", source.step_id, layer, stage, source.rows, self._role_rank
        )
        self._header_writer.write(buffer.header, 0, header)
        buffer.publish_header()
        if source.rows:
            rows = frame_rows(buffer.tensor, layout, self._wire.hidden_size, self._partials_dtype)
            rows.copy_(output[source.offset : source.offset + source.rows])
        return buffer.tensor[: layout.size]

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
