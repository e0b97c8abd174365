"""ExampleKitPatternConnector: a pattern of this package's own, written on afd-core's kit.

:class:`KitBlock` pairs ranks by the kit's block rule (``expert_placement`` None, so its
pairing is :data:`afd_core.kit.pairing.BLOCK`) and moves each layer as headed messages
on a kit :class:`~afd_core.kit.channel.MessageChannel`, one per stage, so that both roles
count a stage's calls alike (``a2f``, ``f2a``, ``a2f``, ...). A message is a
:class:`BlockHeader` and, when it has any, the rows. The attention rank sends ``a2f``
and receives ``f2a``; the FFN rank receives the ``a2f`` of every attention rank of the
step (each header checked against the announced rows), and sends each its rows of the
output. The kit keeps the rules: ``StepExchanges`` (every layer and stage once, in
order), ``InFlight`` (each result paired with its send), the channel (sequence numbers,
bounded waits naming the peer, headers checked with both views). The gate runs on the
FFN role; host tensors only (the gloo data plane).
"""

from __future__ import annotations

import struct
import time
from dataclasses import astuple, dataclass
from typing import ClassVar

import torch

from afd_core.assembly import (
    AttentionSide,
    Control,
    FFNSide,
    Layout,
    Pattern,
    Recipe,
    RuntimeSpec,
    StepAnnouncer,
    StepSource,
    gloo_data_plane,
)
from afd_core.connector import (
    AttentionEndpoint,
    Connector,
    ExpertRouting,
    FFNEndpoint,
    FFNLayerBatch,
    FFNStep,
)
from afd_core.errors import AFDProtocolError
from afd_core.failures import guarded, guarded_until_closed, layer_of_step
from afd_core.kit.channel import MessageChannel
from afd_core.kit.endpoint_context import EndpointContext
from afd_core.kit.header_fields import differing_fields
from afd_core.kit.in_flight import InFlight
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.wire.metadata import ControlPayload

OPS = ("a2f", "f2a")
MISPAIRED = (
    "The roles' exchanges are mispaired (a layer or stage skipped or repeated, or other "
    "row counts than announced); run ExampleKitPatternConnector of one "
    "afd-example-connector version, with the same AFD config, on both roles"
)


@dataclass(frozen=True)
class BlockHeader:
    """The kit ``Header`` of one message: what it is, the sender's call number on the
    stage's channel with the receiver, its world rank, and the rows that follow."""

    SIZE: ClassVar[int] = 32
    MAGIC: ClassVar[bytes] = b"EXKB"
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<4sBQIIII")

    op: str
    seq: int
    source: int
    layer: int
    stage: int
    rows: int

    def encode(self) -> bytes:
        op, *numbers = astuple(self)
        return self.LAYOUT.pack(self.MAGIC, OPS.index(op), *numbers).ljust(self.SIZE, b"\0")

    @classmethod
    def decode(cls, data: bytes) -> BlockHeader:
        magic, op, *numbers = cls.LAYOUT.unpack_from(data)
        if magic != cls.MAGIC or op >= len(OPS):
            raise AFDProtocolError(
                f"AFD example: a message starts with {magic!r} (op {op}), not a "
                f"{cls.MAGIC!r} header; run ExampleKitPatternConnector on both roles"
            )
        return cls(OPS[op], *numbers)

    def differences(self, expected: BlockHeader, *, ignore: tuple[str, ...] = ()) -> list[str]:
        return differing_fields(self, expected, ignore)


class KitBlock(Pattern):
    """The block pattern on the kit (see the module docstring), on one world of every
    rank: its channels name peers by world rank."""

    name: ClassVar[str] = "example kit block"
    gate_on_attention = False
    gate_reason = "its messages carry hidden states only, so the gate runs on the FFN role"

    def attention_endpoint(self, side: AttentionSide) -> KitBlockAttention:
        (peer,) = side.peers  # the block rule: one FFN rank per attention rank
        assert side.announcer is not None, "KitBlock needs announced steps"
        stages = _Stages(side.spec, side.transport_context())
        return KitBlockAttention(stages, peer.transport_rank, side.announcer)

    def ffn_endpoint(self, side: FFNSide) -> KitBlockFFN:
        assert side.steps is not None, "KitBlock needs announced steps"
        return KitBlockFFN(_Stages(side.spec, side.transport_context()), side.steps)


class ExampleKitPatternConnector(Connector):
    """One world, announced steps, afd-core's gloo data plane, this package's pattern."""

    name = "ExampleKitPatternConnector"
    pattern_type = KitBlock

    def recipe(self) -> Recipe:
        return Recipe(Layout.WORLD, Control.ANNOUNCED, gloo_data_plane(), KitBlock())


class _Stages:
    """What both endpoints share: a channel per stage (a step has at most two), the rule
    of a step's exchanges, and the rows the wire spec carries."""

    def __init__(self, spec: RuntimeSpec, context: EndpointContext) -> None:
        self.spec, self.wire = spec, context.wire
        self.dtype = getattr(torch, context.wire.dtype)
        self.channels = tuple(
            MessageChannel("afd_example", BlockHeader, f"stage {stage}", context.transport,
                           spec.world_rank, spec.topology, spec.timeout_s, MISPAIRED,
                           fuse=context.fuse)
            for stage in range(2)
        )  # fmt: skip
        who = f"{spec.role} rank {spec.role_rank}"
        self.exchanges = StepExchanges(spec.wire.exchange_layers, who)

    def deadline(self) -> float:
        return time.monotonic() + self.spec.timeout_s

    def rows_of(self, tensor: torch.Tensor, what: str) -> int:
        """``tensor``'s rows; ValueError unless the wire spec carries it."""
        hidden = self.wire.hidden_size
        if tensor.dtype != self.dtype or tensor.shape[1:] != (hidden,) or not (
            tensor.is_contiguous() and tensor.is_cpu
        ):  # fmt: skip
            raise ValueError(
                f"AFD example: {what} must be a contiguous CPU [rows, {hidden}] {self.dtype} "
                f"tensor, not {list(tensor.shape)} {tensor.dtype} on {tensor.device}"
            )
        return len(tensor)

    def receive_header(self, stage: int, peer: int, expected: BlockHeader, deadline: float,
                       doing: str) -> None:  # fmt: skip
        """Receive the next header of ``peer`` on ``stage``'s channel and check it."""
        channel = self.channels[stage]
        head = channel.header_buffer()
        channel.wait(channel.post(peer, head, send=False), deadline, doing)
        channel.check(head, expected)


class KitBlockAttention(AttentionEndpoint):
    """Attention side: announce each step; ``a2f`` per send, ``f2a`` per recv."""

    _tokens: tuple[int, ...]

    def __init__(self, stages: _Stages, peer: int, announcer: StepAnnouncer) -> None:
        self._stages, self._peer, self._announcer = stages, peer, announcer
        self._fuse, self._me = stages.spec.fuse, stages.spec.world_rank
        self._in_flight: InFlight[int] = InFlight("AFD example", stages.spec.role_rank)
        self._step_id, self._tokens = -1, ()  # the step in progress, its rows per stage

    @guarded
    def begin_step(self, payload: ControlPayload) -> None:
        tokens = self._stages.exchanges.begin_announced(payload, self._stages.spec.role_rank)
        self._announcer.send(payload)
        self._step_id, self._tokens = payload.step_id, tokens
        self._in_flight.clear()

    @guarded
    def send(self, layer: int, stage: int, hidden: torch.Tensor, *,
             router_logits: torch.Tensor | None = None,
             routing: ExpertRouting | None = None) -> None:  # fmt: skip
        rows = self._stages.rows_of(hidden, f"the hidden states of layer {layer}")
        self._stages.exchanges.take(layer, stage)
        if router_logits is not None or routing is not None:
            raise AFDProtocolError("AFD example: the gate runs on the FFN role; send no logits")
        if rows != self._tokens[stage]:
            raise AFDProtocolError(
                f"AFD example: step {self._step_id} announced {self._tokens[stage]} tokens in "
                f"stage {stage}, layer {layer} sends {rows}; send what begin_step announced"
            )
        self._in_flight.check_free(layer, stage)
        channel = self._stages.channels[stage]
        channel.finish_sends(self._peer, self._stages.deadline())
        header = BlockHeader("a2f", channel.next_call(self._peer), self._me, layer, stage, rows)
        channel.send(self._peer, header, [hidden] if rows else [])
        self._in_flight.put(layer, stage, rows)

    @guarded
    def recv(self, layer: int, stage: int) -> torch.Tensor:
        rows = self._in_flight.take(layer, stage)
        channel, peer, deadline = self._stages.channels[stage], self._peer, self._stages.deadline()
        doing = f"the result of {layer_of_step(layer, self._step_id)}"
        expected = BlockHeader("f2a", channel.next_call(peer), peer, layer, stage, rows)
        self._stages.receive_header(stage, peer, expected, deadline, doing)
        channel.finish_sends(peer, deadline)
        out = torch.empty((rows, self._stages.wire.hidden_size), dtype=self._stages.dtype)
        if rows:
            channel.wait(channel.post(peer, out, send=False), deadline, doing)
        self._stages.exchanges.finish()
        return out


class KitBlockFFN(FFNEndpoint):
    """FFN side: the announced steps; ``a2f`` of every rank per recv, ``f2a`` per send."""

    def __init__(self, stages: _Stages, steps: StepSource) -> None:
        self._stages, self._steps, self._fuse = stages, steps, stages.spec.fuse
        self._me, self._topology = stages.spec.world_rank, stages.spec.topology

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        step: FFNStep | None = self._steps.next_step()
        if step is not None:
            self._stages.exchanges.begin(step.payloads[0].step_id, step.num_stages)
        return step

    @guarded
    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        self._stages.exchanges.take(layer, stage)
        channel, deadline = self._stages.channels[stage], self._stages.deadline()
        doing, splits = layer_of_step(layer, step.payloads[0].step_id), step.stage_tokens(stage)
        peers = [self._topology.world_rank("attention", a) for a in step.attention_ranks]
        for peer, rows in zip(peers, splits, strict=True):
            expected = BlockHeader("a2f", channel.next_call(peer), peer, layer, stage, rows)
            self._stages.receive_header(stage, peer, expected, deadline, doing)
        hidden = torch.empty((sum(splits), self._stages.wire.hidden_size), dtype=self._stages.dtype)
        parts = zip(peers, hidden.split(list(splits)), strict=True)
        for transfer in [channel.post(p, part, send=False) for p, part in parts if len(part)]:
            channel.wait(transfer, deadline, doing)
        return FFNLayerBatch(step=step, layer=layer, stage=stage, hidden=hidden, splits=splits)

    @guarded
    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        if self._stages.rows_of(output, "the FFN output") != sum(batch.splits):
            raise ValueError(f"AFD example: the FFN output must have {sum(batch.splits)} rows")
        channel, deadline = self._stages.channels[batch.stage], self._stages.deadline()
        peers = [self._topology.world_rank("attention", a) for a in batch.step.attention_ranks]
        for peer, part in zip(peers, output.split(list(batch.splits)), strict=True):
            seq = channel.next_call(peer)
            header = BlockHeader("f2a", seq, self._me, batch.layer, batch.stage, len(part))
            channel.send(peer, header, [part] if len(part) else [])
        for peer in peers:  # the contract: the results are sent when send() returns
            channel.finish_sends(peer, deadline)
        self._stages.exchanges.finish()
