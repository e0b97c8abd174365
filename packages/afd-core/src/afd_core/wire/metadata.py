"""Metadata that travels with an AFD step: what the model sees and what goes on the wire.

* :class:`AFDStepMetadata` is installed by the attention runner at
  ``forward_context.additional_kwargs["afd_metadata"]`` for every forward.
* :class:`AFDDPMetadata` holds the token counts of a group of attention ranks.
* :class:`ControlPayload` is the per-step control message (attention -> FFN) with a
  versioned byte codec: never pickled, checked on decode.
* :class:`TransferHeader` precedes every data message; the receiver checks it against what
  it expects and raises :class:`~afd_core.errors.AFDProtocolError` naming both views.

Pure Python: no torch, no vLLM.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import ClassVar

from afd_core.errors import AFDProtocolError

#: Names of the dtypes allowed on the wire, with their one-byte codes.
WIRE_DTYPES: dict[str, int] = {"bfloat16": 1, "float16": 2, "float32": 3}
_DTYPE_NAMES = {code: name for name, code in WIRE_DTYPES.items()}
#: Message directions and their one-byte codes.
DIRECTIONS: dict[str, int] = {"a2f": 0, "f2a": 1}
_DIRECTION_NAMES = {code: name for name, code in DIRECTIONS.items()}


@dataclass(frozen=True)
class AFDStepMetadata:
    """What the attention model needs to know about the current forward (one step).

    ``padded_lens[s]`` is the token count of stage (micro-batch) ``s`` as exchanged with
    the FFN role (a CUDA graph's padded batch size when a graph runs the forward);
    ``stage_index`` is the stage this forward runs. A forward without micro-batching has
    one stage.
    """

    step_id: int
    padded_lens: tuple[int, ...]
    stage_index: int = 0

    def __post_init__(self) -> None:
        n = len(self.padded_lens)
        if n == 0:
            raise ValueError("AFDStepMetadata needs at least one stage")
        if not 0 <= self.stage_index < n:
            raise ValueError(f"AFDStepMetadata.stage_index {self.stage_index} not in 0..{n - 1}")
        if any(tokens < 0 for tokens in self.padded_lens):
            raise ValueError(f"AFDStepMetadata: negative token count in {self.padded_lens}")

    @property
    def num_stages(self) -> int:
        """Number of stages (micro-batches) of this step."""
        return len(self.padded_lens)

    @classmethod
    def single_stage(cls, step_id: int, num_tokens: int) -> AFDStepMetadata:
        """Metadata for a forward of ``num_tokens`` tokens without micro-batching."""
        return cls(step_id=step_id, padded_lens=(num_tokens,))


@dataclass(frozen=True)
class AFDDPMetadata:
    """Token counts of a contiguous group of attention ranks for one stage.

    ``num_tokens[i]`` belongs to attention rank ``first_rank + i``.
    """

    first_rank: int
    num_tokens: tuple[int, ...]

    def tokens_of(self, attention_rank: int) -> int:
        """Token count of ``attention_rank``; raises if this group does not cover it."""
        i = attention_rank - self.first_rank
        if not 0 <= i < len(self.num_tokens):
            raise AFDProtocolError(
                f"AFD control: payload covers attention ranks {self.first_rank}.."
                f"{self.first_rank + len(self.num_tokens) - 1}, not {attention_rank}"
            )
        return self.num_tokens[i]


@dataclass(frozen=True)
class ControlPayload:
    """The per-step control message from one attention rank to the FFN rank serving it.

    ``stages[s]`` holds the token counts of stage ``s`` for the ranks the sender knows
    (itself, or its whole data-parallel group). ``sender_rank`` is the sender's attention
    role rank. The flags tell FFN why the forward runs. ``is_graph_step``: the step's
    forward is a CUDA graph (captured now when ``is_graph_capturing``, else replayed), so
    its data messages carry no header and, while capturing, no data flows at all (see
    docs/wire-protocol.md).
    """

    VERSION: ClassVar[int] = 1
    MAGIC: ClassVar[bytes] = b"AFDC"
    _HEAD: ClassVar[struct.Struct] = struct.Struct("<4sHHQIIHH")

    step_id: int
    sender_rank: int
    stages: tuple[AFDDPMetadata, ...]
    is_warmup: bool = False
    is_graph_capturing: bool = False
    is_profile: bool = False
    is_graph_step: bool = False

    def __post_init__(self) -> None:
        if self.is_graph_capturing and not self.is_graph_step:
            raise ValueError("ControlPayload: a capturing step is a graph step")
        if not self.stages:
            raise ValueError("ControlPayload needs at least one stage")
        first, width = self.stages[0].first_rank, len(self.stages[0].num_tokens)
        for stage in self.stages:
            if stage.first_rank != first or len(stage.num_tokens) != width:
                raise ValueError("ControlPayload stages must cover the same attention ranks")
            if any(n < 0 for n in stage.num_tokens):
                raise ValueError(f"ControlPayload: negative token count in {stage.num_tokens}")

    def tokens_of(self, attention_rank: int) -> tuple[int, ...]:
        """Per-stage token counts of ``attention_rank``."""
        return tuple(stage.tokens_of(attention_rank) for stage in self.stages)

    def encode(self) -> bytes:
        """Serialise to the versioned wire form (little-endian, fixed layout)."""
        flags = (
            (1 if self.is_warmup else 0)
            | (2 if self.is_graph_capturing else 0)
            | (4 if self.is_profile else 0)
            | (8 if self.is_graph_step else 0)
        )
        width = len(self.stages[0].num_tokens)
        head = self._HEAD.pack(
            self.MAGIC,
            self.VERSION,
            flags,
            self.step_id,
            self.sender_rank,
            self.stages[0].first_rank,
            len(self.stages),
            width,
        )
        counts = [n for stage in self.stages for n in stage.num_tokens]
        return head + struct.pack(f"<{len(counts)}I", *counts)

    @classmethod
    def decode(cls, data: bytes) -> ControlPayload:
        """Parse bytes made by :meth:`encode`; raise AFDProtocolError on anything else."""
        if len(data) < cls._HEAD.size:
            raise AFDProtocolError(
                f"AFD control: payload of {len(data)} bytes is shorter than its "
                f"{cls._HEAD.size}-byte header; the peer does not speak this protocol"
            )
        magic, version, flags, step, sender, first, n_stages, width = cls._HEAD.unpack_from(data)
        if magic != cls.MAGIC:
            raise AFDProtocolError(
                f"AFD control: bad magic {magic!r} (expected {cls.MAGIC!r}); a data message "
                "arrived where a control payload was expected, or the peer is not AFD"
            )
        if version != cls.VERSION:
            raise AFDProtocolError(
                f"AFD control: payload version {version}, this side speaks {cls.VERSION}; "
                "install the same afd-core version on both roles"
            )
        expected = cls._HEAD.size + 4 * n_stages * width
        if len(data) != expected:
            raise AFDProtocolError(
                f"AFD control: payload is {len(data)} bytes, its header announces {expected}"
            )
        counts = struct.unpack_from(f"<{n_stages * width}I", data, cls._HEAD.size)
        stages = tuple(
            AFDDPMetadata(first, tuple(counts[s * width : (s + 1) * width]))
            for s in range(n_stages)
        )
        if flags & 2 and not flags & 8:
            raise AFDProtocolError(
                f"AFD control: payload of step {step} flags a CUDA graph capture that is not "
                "a graph step; the peer's afd-core is broken or of another version"
            )
        return cls(
            step_id=step,
            sender_rank=sender,
            stages=stages,
            is_warmup=bool(flags & 1),
            is_graph_capturing=bool(flags & 2),
            is_profile=bool(flags & 4),
            is_graph_step=bool(flags & 8),
        )


@dataclass(frozen=True)
class TransferHeader:
    """The fixed-size header of one data message (hidden states one way or the other).

    ``direction`` is ``"a2f"`` (attention to FFN) or ``"f2a"``; ``num_tokens`` the rows
    of the message. ``logits_width`` is the number of router-logit columns that follow
    the hidden states (0 unless the gate runs on attention and the connector sends
    logits); ``logits_dtype`` their dtype name (ignored when ``logits_width`` is 0).
    ``topk`` is the number of routed experts per row whose ids and weights follow the
    hidden states (expert-routed connectors; 0 otherwise). ``sender_rank`` is the
    sender's role rank (attention rank for a2f, FFN rank for f2a).
    """

    SIZE: ClassVar[int] = 64
    MAGIC: ClassVar[bytes] = b"AFDT"
    VERSION: ClassVar[int] = 5
    #: The byte layout of the first :data:`LAYOUT.size` bytes (the rest is zero).
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("<4sHBBQIHHIIIIBH")

    direction: str
    step_id: int
    layer: int
    stage: int
    num_tokens: int
    dtype: str
    hidden_size: int
    sender_rank: int
    logits_width: int = 0
    logits_dtype: str = "float32"
    topk: int = 0

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"TransferHeader.direction must be 'a2f' or 'f2a', not {self.direction!r}"
            )
        for name in ("dtype", "logits_dtype"):
            if getattr(self, name) not in WIRE_DTYPES:
                raise ValueError(
                    f"TransferHeader.{name} {getattr(self, name)!r} is not one of "
                    f"{sorted(WIRE_DTYPES)}"
                )

    def encode(self) -> bytes:
        """The 64-byte wire form."""
        packed = self.LAYOUT.pack(
            self.MAGIC,
            self.VERSION,
            DIRECTIONS[self.direction],
            WIRE_DTYPES[self.dtype],
            self.step_id,
            self.layer,
            self.stage,
            0,
            self.num_tokens,
            self.hidden_size,
            self.sender_rank,
            self.logits_width,
            WIRE_DTYPES[self.logits_dtype],
            self.topk,
        )
        return packed.ljust(self.SIZE, b"\0")

    @classmethod
    def decode(cls, data: bytes) -> TransferHeader:
        """Parse a 64-byte header; raise AFDProtocolError for anything that is not one."""
        if len(data) != cls.SIZE:
            raise AFDProtocolError(f"AFD data: header is {len(data)} bytes, expected {cls.SIZE}")
        (
            magic,
            version,
            direction,
            dtype,
            step,
            layer,
            stage,
            _pad,
            tokens,
            hidden,
            sender,
            logits_width,
            logits_dtype,
            topk,
        ) = cls.LAYOUT.unpack_from(data)
        if magic != cls.MAGIC:
            raise AFDProtocolError(
                f"AFD data: bad magic {magic!r} (expected {cls.MAGIC!r}); the peers are "
                "out of step or the peer is not an AFD connector"
            )
        if version != cls.VERSION:
            raise AFDProtocolError(
                f"AFD data: header version {version}, this side speaks {cls.VERSION}; "
                "install the same afd-core version on both roles"
            )
        if dtype not in _DTYPE_NAMES or logits_dtype not in _DTYPE_NAMES or direction > 1:
            raise AFDProtocolError(
                f"AFD data: unknown dtype code {dtype}/{logits_dtype} or direction {direction}"
            )
        return cls(
            direction=_DIRECTION_NAMES[direction],
            step_id=step,
            layer=layer,
            stage=stage,
            num_tokens=tokens,
            dtype=_DTYPE_NAMES[dtype],
            hidden_size=hidden,
            sender_rank=sender,
            logits_width=logits_width,
            logits_dtype=_DTYPE_NAMES[logits_dtype],
            topk=topk,
        )

    def differences(self, expected: TransferHeader, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """``"field: received X, expected Y"`` for each field (not in ``ignore``) that
        differs; ``logits_dtype`` counts only when a header carries logits."""
        return [
            f"{f.name}: received {getattr(self, f.name)!r}, expected {getattr(expected, f.name)!r}"
            for f in fields(self)
            if f.name not in ignore
            and getattr(self, f.name) != getattr(expected, f.name)
            and not (f.name == "logits_dtype" and self.logits_width == expected.logits_width == 0)
        ]

    def check(self, expected: TransferHeader, *, ignore: tuple[str, ...] = ()) -> None:
        """Raise AFDProtocolError unless this (received) header matches ``expected``.

        The message lists every field that differs with both sides' values; fields in
        ``ignore`` are not compared.
        """
        diffs = self.differences(expected, ignore=ignore)
        if diffs:
            raise AFDProtocolError(
                f"AFD data: a {self.direction} message differs from what this rank expected "
                f"(step {expected.step_id}, layer {expected.layer}, stage {expected.stage}): "
                + "; ".join(diffs)
                + ". The two roles disagree on the model or the step sequence: start both "
                "with the same model and AFD config"
            )
