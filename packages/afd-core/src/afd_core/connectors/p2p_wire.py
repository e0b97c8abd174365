"""The byte-level pieces of the P2P wire protocol (pure Python, no torch).

* **control** (attention -> FFN, tag :data:`TAG_CONTROL`, once per step): one fixed-size
  frame of :data:`CONTROL_FRAME_BYTES` bytes: an int64 length, the
  :class:`~afd_core.metadata.ControlPayload` bytes, zero padding;
* **data** (tag :data:`TAG_A2F` or :data:`TAG_F2A`, per layer and stage): one uint8
  message: the 64-byte :class:`~afd_core.metadata.TransferHeader`, the hidden states,
  then (attention -> FFN with the gate on attention) the router logits.

Both sides know every message size in advance: control frames are fixed, and a data
message holds the token count the attention rank announced for the stage, times the
:class:`~afd_core.connector.WireSpec` row size. :class:`StepAssembler` turns the control
payloads an FFN rank received into one :class:`~afd_core.connector.FFNStep`.
See ``docs/wire-protocol.md``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from afd_core.connector import FFNStep, WireSpec
from afd_core.errors import AFDProtocolError
from afd_core.metadata import WIRE_DTYPES, ControlPayload, TransferHeader

if TYPE_CHECKING:
    from afd_core.topology import Role, Topology

#: Message tags (gloo slots; NCCL ignores them). Non-negative int32, far from the small
#: tags that collectives use.
TAG_CONTROL = 0x41460001
TAG_A2F = 0x41460002
TAG_F2A = 0x41460003
#: Tag of the receive a transport may post to itself to interrupt its waits on close.
TAG_WAKE = 0x414600FF

#: Size of every control frame: an int64 length, the payload, zero padding.
CONTROL_FRAME_BYTES = 512
_LENGTH = struct.Struct("<q")

#: Bytes per element of each wire dtype.
DTYPE_SIZES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
HEADER_BYTES = TransferHeader.SIZE

_LAYOUT = TransferHeader._LAYOUT  # the header layout belongs to metadata.py
_PAD = b"\0" * (HEADER_BYTES - _LAYOUT.size)
_DIRECTIONS = {"a2f": 0, "f2a": 1}


def encode_control_frame(payload: ControlPayload) -> bytes:
    """The fixed-size frame carrying ``payload``.

    Raises AFDProtocolError when the payload does not fit (more than 119 token counts:
    stages times ranks).
    """
    body = payload.encode()
    if _LENGTH.size + len(body) > CONTROL_FRAME_BYTES:
        raise AFDProtocolError(
            f"AFD control: payload of step {payload.step_id} is {len(body)} bytes "
            f"({len(payload.stages)} stages x {len(payload.stages[0].num_tokens)} ranks); a "
            f"control frame holds at most {CONTROL_FRAME_BYTES - _LENGTH.size}; send the "
            "counts of this rank only, or fewer stages"
        )
    return (_LENGTH.pack(len(body)) + body).ljust(CONTROL_FRAME_BYTES, b"\0")


def decode_control_frame(frame: bytes) -> ControlPayload:
    """Parse a frame made by :func:`encode_control_frame`; AFDProtocolError otherwise."""
    if len(frame) != CONTROL_FRAME_BYTES:
        raise AFDProtocolError(
            f"AFD control: frame is {len(frame)} bytes, expected {CONTROL_FRAME_BYTES}"
        )
    (length,) = _LENGTH.unpack_from(frame)
    if not 0 < length <= CONTROL_FRAME_BYTES - _LENGTH.size:
        raise AFDProtocolError(
            f"AFD control: frame announces a {length}-byte payload (a frame holds at most "
            f"{CONTROL_FRAME_BYTES - _LENGTH.size}); the peer does not speak this protocol"
        )
    return ControlPayload.decode(bytes(frame[_LENGTH.size : _LENGTH.size + length]))


def hidden_nbytes(num_tokens: int, wire: WireSpec) -> int:
    """Bytes of ``num_tokens`` rows of hidden states."""
    return num_tokens * wire.hidden_size * DTYPE_SIZES[wire.dtype]


def logits_nbytes(num_tokens: int, wire: WireSpec) -> int:
    """Bytes of ``num_tokens`` rows of router logits (0 when the gate runs on FFN)."""
    return num_tokens * wire.router_logits_width * DTYPE_SIZES[wire.router_logits_dtype]


def a2f_header(
    step_id: int, layer: int, stage: int, num_tokens: int, attention_rank: int, wire: WireSpec
) -> TransferHeader:
    """The header of the message ``attention_rank`` sends for this layer and stage."""
    width = wire.logits_width_at(layer)
    return TransferHeader(
        direction="a2f",
        step_id=step_id,
        layer=layer,
        stage=stage,
        num_tokens=num_tokens,
        dtype=wire.dtype,
        hidden_size=wire.hidden_size,
        sender_rank=attention_rank,
        logits_width=width,
        logits_dtype=wire.router_logits_dtype if width else "float32",
    )


def f2a_header(
    step_id: int, layer: int, stage: int, num_tokens: int, ffn_rank: int, wire: WireSpec
) -> TransferHeader:
    """The header of the result ``ffn_rank`` sends back for this layer and stage."""
    return TransferHeader(
        direction="f2a",
        step_id=step_id,
        layer=layer,
        stage=stage,
        num_tokens=num_tokens,
        dtype=wire.dtype,
        hidden_size=wire.hidden_size,
        sender_rank=ffn_rank,
    )


def with_layer(header: TransferHeader, layer: int) -> TransferHeader:
    """``dataclasses.replace(header, layer=layer)`` in a fifth of the time (hot path).

    Skips ``__post_init__``: ``header`` was validated when it was built and ``layer`` is
    an int.
    """
    copy = object.__new__(TransferHeader)
    copy.__dict__.update(header.__dict__)
    copy.__dict__["layer"] = layer
    return copy


class HeaderPacker:
    """Encodes the headers of one wire spec without building TransferHeader objects.

    ``pack(...)`` returns exactly ``a2f_header(...).encode()`` / ``f2a_header(...).encode()``
    (the per-layer hot path: one struct call).
    """

    def __init__(self, wire: WireSpec) -> None:
        width = wire.router_logits_width
        logits_code = WIRE_DTYPES[wire.router_logits_dtype if width else "float32"]
        self._a2f = (
            TransferHeader.MAGIC,
            TransferHeader.VERSION,
            _DIRECTIONS["a2f"],
            WIRE_DTYPES[wire.dtype],
        )
        self._f2a = (
            TransferHeader.MAGIC,
            TransferHeader.VERSION,
            _DIRECTIONS["f2a"],
            WIRE_DTYPES[wire.dtype],
        )
        self._hidden = wire.hidden_size
        self._a2f_logits = (width, logits_code)
        self._f2a_logits = (0, WIRE_DTYPES["float32"])
        self._dense_layers = frozenset(wire.dense_layers)

    def a2f(self, step_id: int, layer: int, stage: int, num_tokens: int, rank: int) -> bytes:
        """Bytes of :func:`a2f_header` for these values."""
        logits = self._f2a_logits if layer in self._dense_layers else self._a2f_logits
        return self._pack(self._a2f, step_id, layer, stage, num_tokens, rank, logits)

    def f2a(self, step_id: int, layer: int, stage: int, num_tokens: int, rank: int) -> bytes:
        """Bytes of :func:`f2a_header` for these values."""
        return self._pack(self._f2a, step_id, layer, stage, num_tokens, rank, self._f2a_logits)

    def _pack(
        self,
        head: tuple[bytes, int, int, int],
        step_id: int,
        layer: int,
        stage: int,
        num_tokens: int,
        rank: int,
        logits: tuple[int, int],
    ) -> bytes:
        fields = (step_id, layer, stage, 0, num_tokens, self._hidden, rank)
        return _LAYOUT.pack(*head, *fields, *logits) + _PAD


def describe_rank(topology: Topology, role: Role, role_rank: int) -> str:
    """``"FFN rank 0 (world rank 0)"`` / ``"attention rank 1 (world rank 2)"``."""
    name = "FFN" if role == "ffn" else "attention"
    return f"{name} rank {role_rank} (world rank {topology.world_rank(role, role_rank)})"


def header_differences(actual: TransferHeader, expected: TransferHeader) -> list[str]:
    """``"field=actual (expected x)"`` for each field that differs.

    ``logits_dtype`` does not count when neither header carries logits.
    """
    return [
        f"{f.name}={getattr(actual, f.name)!r} (expected {getattr(expected, f.name)!r})"
        for f in fields(actual)
        if getattr(actual, f.name) != getattr(expected, f.name)
        and not (f.name == "logits_dtype" and actual.logits_width == expected.logits_width == 0)
    ]


def check_received(raw: bytes, expected: TransferHeader, sender: str) -> None:
    """Raise AFDProtocolError unless ``raw`` is a header equal to ``expected``.

    The message names every differing field with both views and the sender.
    """
    try:
        TransferHeader.decode(raw).check(expected)
    except AFDProtocolError as exc:
        raise AFDProtocolError(f"{exc} [sent by {sender}]") from None


class StepAssembler:
    """FFN side: turns the control payloads that are ready into one :class:`FFNStep`.

    ``block`` is the FFN rank's block of attention ranks. Each attention rank's step ids
    must increase by one from payload to payload (the first one may be anything); every
    rank of a step must have the same number of stages.
    """

    def __init__(self, block: Sequence[int]) -> None:
        self.block = tuple(block)
        self._last_step: dict[int, int] = {}

    def assemble(self, ready: Mapping[int, ControlPayload]) -> FFNStep:
        """One step from ``ready`` (attention rank -> its next payload), in block order.

        Raises AFDProtocolError for a payload from outside the block, a wrong sender
        rank, a step id that does not follow the rank's previous one, or stage counts
        that differ between ranks. Nothing is recorded when it raises.
        """
        ranks = [r for r in self.block if r in ready]
        strangers = sorted(set(ready) - set(self.block))
        if strangers or not ranks:
            raise AFDProtocolError(
                f"AFD control: payloads from attention ranks {strangers} reached an FFN rank "
                f"serving {list(self.block)}; both roles must use the same topology"
            )
        tokens = []
        for rank in ranks:
            payload = ready[rank]
            if payload.sender_rank != rank:
                raise AFDProtocolError(
                    f"AFD control: attention rank {rank} sent a payload signed by attention "
                    f"rank {payload.sender_rank}; set role_rank consistently on every server"
                )
            last = self._last_step.get(rank)
            if last is not None and payload.step_id != last + 1:
                raise AFDProtocolError(
                    f"AFD control: attention rank {rank} sent step {payload.step_id} after "
                    f"step {last}; step ids must increase by one (a step was lost or repeated)"
                )
            tokens.append(payload.tokens_of(rank))
        first = ranks[0]
        for rank, counts in zip(ranks, tokens, strict=True):
            if len(counts) != len(tokens[0]):
                raise AFDProtocolError(
                    f"AFD control: attention rank {first} runs {len(tokens[0])} stage(s) in "
                    f"step {ready[first].step_id}, attention rank {rank} runs {len(counts)} in "
                    f"step {ready[rank].step_id}; micro-batching must be set alike on all "
                    "attention ranks"
                )
        for rank in ranks:
            self._last_step[rank] = ready[rank].step_id
        return FFNStep(
            payloads=tuple(ready[r] for r in ranks),
            attention_ranks=tuple(ranks),
            tokens=tuple(tokens),
        )
