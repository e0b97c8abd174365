"""Byte formats the endpoints put on a transport (pure Python, no torch).

* **Control messages** (attention -> FFN, once per step): one fixed-size message of
  :data:`CONTROL_MESSAGE_BYTES`: an int64 length, the
  :class:`~afd_core.wire.metadata.ControlPayload` bytes, zero padding.
* **Step messages** (expert-routed: FFN rank 0 -> the other FFN ranks, once per step): the
  step's control messages, each with the seat generation of its sender, in a fixed size.
* **Data headers**: every eager data message is a 64-byte
  :class:`~afd_core.wire.metadata.TransferHeader` message followed by its body messages (bare
  tensors), or a *frame*: one message holding the header and then the tensors.
  :class:`HeaderCodec` writes headers straight into a header buffer and builds the bytes
  a receiver expects; :func:`raise_header_mismatch` explains a difference.

Words (``docs/wire-protocol.md`` section 2): a *message* is one send on a transport;
*control* and *step messages* are the fixed-size ones above; a *header message* is a
header sent alone, followed by its *body*; a *frame* is one data message that holds its
header and then its tensors. Both sides know every message size before it arrives (the
fixed sizes, token counts announced by the control payload, the
:class:`~afd_core.connector.WireSpec` they agreed on at rendezvous), except the routed
row counts of expert-routed messages, which the header itself carries.
``docs/wire-protocol.md`` describes the whole protocol.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from afd_core.errors import AFDProtocolError
from afd_core.wire.metadata import DIRECTIONS, WIRE_DTYPES, ControlPayload, TransferHeader

if TYPE_CHECKING:
    from afd_core.connector import WireSpec
    from afd_core.topology import Role, Topology

#: Size of every control message: an int64 length, the payload, zero padding.
CONTROL_MESSAGE_BYTES = 512
_LENGTH = struct.Struct("<q")

#: Bytes per element of each wire dtype.
DTYPE_SIZES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
HEADER_BYTES = TransferHeader.SIZE
#: Routed expert ids travel as int32, their weights as float32.
ROUTING_ID_DTYPE = "int32"
ROUTING_WEIGHT_DTYPE = "float32"


def encode_control_message(payload: ControlPayload) -> bytes:
    """The fixed-size control message carrying ``payload``.

    Raises AFDProtocolError when the payload does not fit (more than 119 token counts:
    stages times ranks).
    """
    body = payload.encode()
    if _LENGTH.size + len(body) > CONTROL_MESSAGE_BYTES:
        raise AFDProtocolError(
            f"AFD control: payload of step {payload.step_id} is {len(body)} bytes "
            f"({len(payload.stages)} stages x {len(payload.stages[0].num_tokens)} ranks); a "
            f"control message holds at most {CONTROL_MESSAGE_BYTES - _LENGTH.size}; send the "
            "counts of this rank only, or fewer stages"
        )
    return (_LENGTH.pack(len(body)) + body).ljust(CONTROL_MESSAGE_BYTES, b"\0")


def decode_control_message(message: bytes) -> ControlPayload:
    """Parse a message made by :func:`encode_control_message`; AFDProtocolError otherwise."""
    if len(message) != CONTROL_MESSAGE_BYTES:
        raise AFDProtocolError(
            f"AFD control: control message is {len(message)} bytes, expected "
            f"{CONTROL_MESSAGE_BYTES}"
        )
    (length,) = _LENGTH.unpack_from(message)
    if not 0 < length <= CONTROL_MESSAGE_BYTES - _LENGTH.size:
        raise AFDProtocolError(
            f"AFD control: control message announces a {length}-byte payload (it holds at "
            f"most {CONTROL_MESSAGE_BYTES - _LENGTH.size}); the peer does not speak this "
            "protocol"
        )
    return ControlPayload.decode(bytes(message[_LENGTH.size : _LENGTH.size + length]))


#: One payload's entry in a step message: the seat generation of its sender, its control
#: message.
STEP_ENTRY_BYTES = _LENGTH.size + CONTROL_MESSAGE_BYTES


def step_message_bytes(num_attention_ranks: int) -> int:
    """Size of a step message (:func:`encode_step_message`) of a world of that many attention
    ranks."""
    return _LENGTH.size + num_attention_ranks * STEP_ENTRY_BYTES


def encode_step_message(
    payloads: tuple[ControlPayload, ...],
    generations: tuple[int, ...],
    num_attention_ranks: int,
) -> bytes:
    """One step's payloads as FFN rank 0 forwards them: a count, then per payload the
    seat generation of the server that sent it (:mod:`afd_core.runtime.seats`; 0 in a world
    whose attention ranks are never replaced) and its control message, zero padding to
    :func:`step_message_bytes`."""
    if len(generations) != len(payloads):
        raise ValueError("encode_step_message: one generation per payload")
    pairs = zip(payloads, generations, strict=True)
    entries = b"".join(_LENGTH.pack(g) + encode_control_message(p) for p, g in pairs)
    return (_LENGTH.pack(len(payloads)) + entries).ljust(
        step_message_bytes(num_attention_ranks), b"\0"
    )


def decode_step_message(
    message: bytes, num_attention_ranks: int
) -> tuple[tuple[ControlPayload, int], ...]:
    """Parse :func:`encode_step_message` output into ``(payload, generation)`` pairs;
    AFDProtocolError for anything else."""
    if len(message) != step_message_bytes(num_attention_ranks):
        raise AFDProtocolError(
            f"AFD control: step message is {len(message)} bytes, expected "
            f"{step_message_bytes(num_attention_ranks)}"
        )
    (count,) = _LENGTH.unpack_from(message)
    if not 0 < count <= num_attention_ranks:
        raise AFDProtocolError(
            f"AFD control: step message announces {count} payloads for {num_attention_ranks} "
            "attention ranks; the peer does not speak this protocol"
        )
    entries = []
    for i in range(count):
        start = _LENGTH.size + i * STEP_ENTRY_BYTES
        (generation,) = _LENGTH.unpack_from(message, start)
        if generation < 0:
            raise AFDProtocolError(
                f"AFD control: step message names seat generation {generation}; the peer does "
                "not speak this protocol"
            )
        body = message[start + _LENGTH.size : start + STEP_ENTRY_BYTES]
        entries.append((decode_control_message(body), generation))
    return tuple(entries)


def describe_rank(topology: Topology, role: Role, role_rank: int) -> str:
    """``"FFN rank 0 (world rank 0)"`` / ``"attention rank 1 (world rank 2)"``."""
    name = "FFN" if role == "ffn" else "attention"
    return f"{name} rank {role_rank} (world rank {topology.world_rank(role, role_rank)})"


#: Position of ``num_tokens`` among the fields of ``TransferHeader.LAYOUT``.
_NUM_TOKENS_FIELD = 8


class HeaderCodec:
    """Packs the headers of one wire spec (the per-layer hot path).

    :meth:`pack_into` writes exactly ``TransferHeader(...).encode()`` into a buffer
    without building the dataclass; the one writer and check of data headers built on it
    is :class:`~afd_core.wire.headers.HeaderWriter`.
    """

    def __init__(self, wire: WireSpec) -> None:
        self._wire = wire
        self._dtype = WIRE_DTYPES[wire.dtype]
        self._logits_code = WIRE_DTYPES[wire.router_logits_dtype]
        self._no_logits_code = WIRE_DTYPES["float32"]
        self._layout = TransferHeader.LAYOUT

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

    def num_tokens_of(self, raw: bytes) -> int:
        """The ``num_tokens`` field of the packed header ``raw``, unchecked: compare the
        whole header with the expected one afterwards."""
        return int(self._layout.unpack_from(raw)[_NUM_TOKENS_FIELD])


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
