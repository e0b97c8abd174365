"""The header in front of every message of the CPU reference kernels.

Every message between two ranks (``a2e`` / ``e2a``, and the CAM async ``dispatch`` /
``combine``) is a fixed :data:`OpsHeader.SIZE`
byte header, followed (when it carries rows) by one body message whose size the header
gives: the receiver posts the header receive first and sizes the body receive from it,
so no message can be larger than the receive it lands in (gloo aborts the process on
that). The header says which call it belongs to (``seq``: the call number of the sender
on this group with this peer, which the receiver's own count must equal), which op sent
it, who sent it to whom (world ranks), how many rows follow, their hidden size and
dtype, the routing (``topk``, ``gated``) that travels with them and, for the CAM async
messages, the decoder layer they belong to (``layer``). The receiver
compares it with what it expects and raises :class:`~afd_core.errors.AFDProtocolError`
naming both views.

Layout (little endian, :data:`FIELDS`): magic ``b"AFDA"``, version u16, op u8, dtype u8 (a
code of :data:`afd_core.wire.metadata.WIRE_DTYPES`), seq u64, source u32, destination u32, rows
u32, hidden size u32, topk u16, flags u16 (:data:`FLAGS`), layer u32; zero padding to 64
bytes. This module is the one table of the header: the compiled kernels' constants
(``csrc/common/afd_header_table.h``) are generated from it by :mod:`afd_ascend_ops.header_c`.
Pure Python: no torch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Literal

from afd_core.errors import AFDProtocolError
from afd_core.kit.header_fields import differing_fields
from afd_core.wire.metadata import WIRE_DTYPES

Op = Literal["a2e", "e2a", "dispatch", "combine"]
OPS: dict[str, int] = {"a2e": 1, "e2a": 2, "dispatch": 3, "combine": 4}
#: The bits of the flags field.
FLAGS: dict[str, int] = {"gated": 1}  # expert ids and scales follow the rows
#: The wire layout, in order: (field, struct format code). Every field is naturally aligned.
FIELDS: tuple[tuple[str, str], ...] = (
    ("magic", "4s"), ("version", "H"), ("op", "B"), ("dtype", "B"), ("seq", "Q"),
    ("source", "I"), ("destination", "I"), ("rows", "I"), ("hidden_size", "I"),
    ("topk", "H"), ("flags", "H"), ("layer", "I"),
)  # fmt: skip
_OP_NAMES = {code: name for name, code in OPS.items()}
_DTYPE_NAMES = {code: name for name, code in WIRE_DTYPES.items()}
_GATED = FLAGS["gated"]


@dataclass(frozen=True)
class OpsHeader:
    """The header of one message of the ``afd_ascend`` ops (see the module docstring)."""

    SIZE: ClassVar[int] = 64
    MAGIC: ClassVar[bytes] = b"AFDA"
    VERSION: ClassVar[int] = 2
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<" + "".join(code for _, code in FIELDS))

    op: Op
    seq: int
    source: int
    destination: int
    rows: int
    hidden_size: int
    dtype: str
    topk: int = 0
    gated: bool = False
    layer: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"OpsHeader.op must be one of {sorted(OPS)}, not {self.op!r}")
        if self.dtype not in WIRE_DTYPES:
            raise ValueError(f"OpsHeader.dtype {self.dtype!r} is not one of {sorted(WIRE_DTYPES)}")

    def encode(self) -> bytes:
        """The :data:`SIZE`-byte wire form."""
        packed = self.LAYOUT.pack(
            self.MAGIC,
            self.VERSION,
            OPS[self.op],
            WIRE_DTYPES[self.dtype],
            self.seq,
            self.source,
            self.destination,
            self.rows,
            self.hidden_size,
            self.topk,
            _GATED if self.gated else 0,
            self.layer,
        )
        return packed.ljust(self.SIZE, b"\0")

    @classmethod
    def decode(cls, data: bytes) -> OpsHeader:
        """Parse a header; AFDProtocolError for anything that is not one of this version."""
        if len(data) != cls.SIZE:
            raise AFDProtocolError(
                f"afd_ascend: a header is {cls.SIZE} bytes, this message has {len(data)}"
            )
        magic, version, op, dtype, seq, source, dest, rows, hidden, topk, flags, layer = (
            cls.LAYOUT.unpack_from(data)
        )
        if magic != cls.MAGIC:
            raise AFDProtocolError(
                f"afd_ascend: a message starts with {magic!r}, not the header magic "
                f"{cls.MAGIC!r}; the peer is out of step or does not run these ops"
            )
        if version != cls.VERSION:
            raise AFDProtocolError(
                f"afd_ascend: header version {version}, this side speaks {cls.VERSION}; "
                "install the same afd-ascend-ops version on both roles"
            )
        if op not in _OP_NAMES or dtype not in _DTYPE_NAMES or flags & ~_GATED:
            raise AFDProtocolError(
                f"afd_ascend: unknown op code {op}, dtype code {dtype} or flags {flags:#x} "
                "in a header; install the same afd-ascend-ops version on both roles"
            )
        return cls(
            op=_OP_NAMES[op],  # type: ignore[arg-type]
            seq=seq,
            source=source,
            destination=dest,
            rows=rows,
            hidden_size=hidden,
            dtype=_DTYPE_NAMES[dtype],
            topk=topk,
            gated=bool(flags & _GATED),
            layer=layer,
        )

    def differences(self, expected: OpsHeader, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """``"field: sent X, expected Y"`` for every field (not in ``ignore``) that differs
        between this (received) header and ``expected``."""
        return differing_fields(self, expected, ignore)
