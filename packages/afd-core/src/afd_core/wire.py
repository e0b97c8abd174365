"""Byte formats the endpoints put on a transport (pure Python, no torch).

* **Control frames** (attention -> FFN, once per step): one fixed-size frame of
  :data:`CONTROL_FRAME_BYTES`: an int64 length, the
  :class:`~afd_core.metadata.ControlPayload` bytes, zero padding.
* **Data headers**: every eager data message is a 64-byte
  :class:`~afd_core.metadata.TransferHeader` message followed by its body messages (bare
  tensors). :class:`HeaderCodec` writes headers straight into a header buffer and builds
  the bytes a receiver expects; :func:`raise_header_mismatch` explains a difference.

Both sides know every message size before it arrives (a fixed control frame, token
counts announced by the control payload, the :class:`~afd_core.connector.WireSpec` they
agreed on at rendezvous), except the routed row counts of expert-routed messages, which
the header itself carries. ``docs/wire-protocol.md`` describes the whole protocol.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from afd_core.errors import AFDProtocolError
from afd_core.metadata import DIRECTIONS, WIRE_DTYPES, ControlPayload, TransferHeader

if TYPE_CHECKING:
    from afd_core.connector import WireSpec
    from afd_core.topology import Role, Topology

#: Size of every control frame: an int64 length, the payload, zero padding.
CONTROL_FRAME_BYTES = 512
_LENGTH = struct.Struct("<q")

#: Bytes per element of each wire dtype.
DTYPE_SIZES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
HEADER_BYTES = TransferHeader.SIZE
#: Routed expert ids travel as int32, their weights as float32.
ROUTING_ID_DTYPE = "int32"
ROUTING_WEIGHT_DTYPE = "float32"


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


#: One payload's entry in a step frame: the seat generation of its sender, its frame.
STEP_ENTRY_BYTES = _LENGTH.size + CONTROL_FRAME_BYTES


def step_frame_bytes(num_attention_ranks: int) -> int:
    """Size of a step frame (:func:`encode_step_frame`) of a world of that many attention ranks."""
    return _LENGTH.size + num_attention_ranks * STEP_ENTRY_BYTES


def encode_step_frame(
    payloads: tuple[ControlPayload, ...],
    generations: tuple[int, ...],
    num_attention_ranks: int,
) -> bytes:
    """One step's payloads as FFN rank 0 forwards them: a count, then per payload the
    seat generation of the server that sent it (:mod:`afd_core.runtime.seats`; 0 in a world
    whose attention ranks are never replaced) and its control frame, zero padding to
    :func:`step_frame_bytes`."""
    if len(generations) != len(payloads):
        raise ValueError("encode_step_frame: one generation per payload")
    pairs = zip(payloads, generations, strict=True)
    entries = b"".join(_LENGTH.pack(g) + encode_control_frame(p) for p, g in pairs)
    return (_LENGTH.pack(len(payloads)) + entries).ljust(
        step_frame_bytes(num_attention_ranks), b"\0"
    )


def decode_step_frame(
    frame: bytes, num_attention_ranks: int
) -> tuple[tuple[ControlPayload, int], ...]:
    """Parse :func:`encode_step_frame` output into ``(payload, generation)`` pairs;
    AFDProtocolError for anything else."""
    if len(frame) != step_frame_bytes(num_attention_ranks):
        raise AFDProtocolError(
            f"AFD control: step frame is {len(frame)} bytes, expected "
            f"{step_frame_bytes(num_attention_ranks)}"
        )
    (count,) = _LENGTH.unpack_from(frame)
    if not 0 < count <= num_attention_ranks:
        raise AFDProtocolError(
            f"AFD control: step frame announces {count} payloads for {num_attention_ranks} "
            "attention ranks; the peer does not speak this protocol"
        )
    entries = []
    for i in range(count):
        start = _LENGTH.size + i * STEP_ENTRY_BYTES
        (generation,) = _LENGTH.unpack_from(frame, start)
        if generation < 0:
            raise AFDProtocolError(
                f"AFD control: step frame names seat generation {generation}; the peer does "
                "not speak this protocol"
            )
        body = frame[start + _LENGTH.size : start + STEP_ENTRY_BYTES]
        entries.append((decode_control_frame(body), generation))
    return tuple(entries)


def describe_rank(topology: Topology, role: Role, role_rank: int) -> str:
    """``"FFN rank 0 (world rank 0)"`` / ``"attention rank 1 (world rank 2)"``."""
    name = "FFN" if role == "ffn" else "attention"
    return f"{name} rank {role_rank} (world rank {topology.world_rank(role, role_rank)})"


#: Position of ``num_tokens`` among the fields of ``TransferHeader.LAYOUT``.
_NUM_TOKENS_FIELD = 8


class HeaderCodec:
    """Packs and expects the headers of one wire spec (the per-layer hot path).

    :meth:`pack_into` writes exactly ``TransferHeader(...).encode()`` into a buffer
    without building the dataclass; :meth:`expect` checks received header bytes against
    the values a receiver expects; :meth:`header` builds the dataclass (for error
    messages and tests).
    """

    def __init__(self, wire: WireSpec) -> None:
        self._wire = wire
        self._dtype = WIRE_DTYPES[wire.dtype]
        self._logits_code = WIRE_DTYPES[wire.router_logits_dtype]
        self._no_logits_code = WIRE_DTYPES["float32"]
        self._layout = TransferHeader.LAYOUT
        self._expected = memoryview(bytearray(HEADER_BYTES))

    def pack_into(
        self,
        buffer: memoryview,
        offset: int,
        direction: str,
        step_id: int,
        layer: int,
        stage: int,
        num_tokens: int,
        sender_rank: int,
        *,
        logits_width: int = 0,
        topk: int = 0,
    ) -> None:
        """Write the header at ``buffer[offset:offset + 64]`` (the padding stays as it is:
        header buffers start zeroed)."""
        self._layout.pack_into(
            buffer,
            offset,
            TransferHeader.MAGIC,
            TransferHeader.VERSION,
            DIRECTIONS[direction],
            self._dtype,
            step_id,
            layer,
            stage,
            0,
            num_tokens,
            self._wire.hidden_size,
            sender_rank,
            logits_width,
            self._logits_code if logits_width else self._no_logits_code,
            topk,
        )

    def expect(
        self,
        raw: bytes,
        sender: str,
        direction: str,
        step_id: int,
        layer: int,
        stage: int,
        num_tokens: int,
        sender_rank: int,
        *,
        topk: int = 0,
    ) -> None:
        """Raise AFDProtocolError (naming ``sender`` and every differing field) unless
        ``raw`` is exactly the header :meth:`pack_into` writes for these values; the
        comparison is of bytes, the dataclass is built only for the error."""
        expected = self._expected
        self.pack_into(expected, 0, direction, step_id, layer, stage, num_tokens, sender_rank,
                       topk=topk)  # fmt: skip
        if raw != expected:
            header = self.header(direction, step_id, layer, stage, num_tokens, sender_rank,
                                 topk=topk)  # fmt: skip
            raise_header_mismatch(raw, header, sender)

    def num_tokens_of(self, raw: bytes) -> int:
        """The ``num_tokens`` field of the packed header ``raw``, unchecked: compare the
        whole header with the expected one afterwards."""
        return int(self._layout.unpack_from(raw)[_NUM_TOKENS_FIELD])

    def header(
        self,
        direction: str,
        step_id: int,
        layer: int,
        stage: int,
        num_tokens: int,
        sender_rank: int,
        *,
        logits_width: int = 0,
        topk: int = 0,
    ) -> TransferHeader:
        """The header :meth:`pack_into` writes for these values."""
        wire = self._wire
        return TransferHeader(
            direction=direction,
            step_id=step_id,
            layer=layer,
            stage=stage,
            num_tokens=num_tokens,
            dtype=wire.dtype,
            hidden_size=wire.hidden_size,
            sender_rank=sender_rank,
            logits_width=logits_width,
            logits_dtype=wire.router_logits_dtype if logits_width else "float32",
            topk=topk,
        )


def raise_header_mismatch(
    raw: bytes, expected: TransferHeader, sender: str, *, ignore: tuple[str, ...] = ()
) -> None:
    """Raise AFDProtocolError naming every field where ``raw`` differs from ``expected``.

    Returns (without raising) when ``raw`` decodes to a header equal to ``expected`` in
    every field not in ``ignore``.
    """
    try:
        TransferHeader.decode(raw).check(expected, ignore=ignore)
    except AFDProtocolError as exc:
        raise AFDProtocolError(f"{exc} [sent by {sender}]") from None
