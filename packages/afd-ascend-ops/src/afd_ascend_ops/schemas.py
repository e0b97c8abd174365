"""The signatures of the ``afd_ascend`` torch ops: the one place they are written.

Each op's arguments are a frozen dataclass (:class:`A2E`, ...): their names, order, types
and defaults. Its torch schema (:data:`SCHEMAS`) is generated from the dataclass, and the
fake and CPU kernels take one instance of it (:func:`afd_ascend_ops.ops` binds the
dispatcher's arguments), so nothing else writes a signature again.

* ``a2e`` / ``e2a``: the CAM P2P exchange (attention to experts, experts to attention),
  exactly the prior art's schemas (argument names, order and defaults), so a call site
  written for the compiled Ascend kernels runs unchanged on the CPU reference kernels.
* ``afd_async_dispatch_send`` / ``_recv``, ``afd_async_combine_send`` / ``_recv``: the
  CAM async ops in their "compact v2" form (routed experts only; no defaults), with the
  argument order of the compiled kernels they stand for. The README says what each
  argument means and where the meaning is ours.

Pure Python: torch is named only in annotations. :mod:`afd_ascend_ops.ops` defines the
ops with ``torch.library``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

#: The namespace of every op: ``torch.ops.afd_ascend.<name>``.
NAMESPACE = "afd_ascend"

#: Schema type of each annotation the argument dataclasses use.
_SCHEMA_TYPES = {
    "torch.Tensor": "Tensor",
    "torch.Tensor | None": "Tensor?",
    "int": "int",
    "str": "str",
}


@dataclass(frozen=True)
class OpArgs:
    """The arguments of one op; subclasses name the op (``OP``), its result (``RETURNS``,
    in schema syntax) and list the arguments as fields."""

    OP: ClassVar[str]
    RETURNS: ClassVar[str]

    @classmethod
    def schema(cls) -> str:
        """The torch schema of the op: ``name(type arg[=default], ...) -> result``."""
        args = []
        for field in dataclasses.fields(cls):
            arg = f"{_SCHEMA_TYPES[str(field.type)]} {field.name}"
            if field.default is not dataclasses.MISSING:
                arg += "=" + ("None" if field.default is None else repr(field.default))
            args.append(arg)
        return f"{cls.OP}({', '.join(args)}) -> {cls.RETURNS}"


@dataclass(frozen=True)
class A2E(OpArgs):
    """``a2e``: attention rows to the FFN rank (the prior art's schema)."""

    OP: ClassVar[str] = "a2e"
    RETURNS: ClassVar[str] = "Tensor[]"
    x: torch.Tensor
    expert_ids: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    batch_size: int = 0
    hidden_size: int = 0
    topk: int = 0
    expert_rank_size: int = 0
    attention_rank_size: int = 0
    rank: int = 0
    group_ep: str = ""
    aiv_num: int = 0
    compute_gate: int = 0


@dataclass(frozen=True)
class E2A(OpArgs):
    """``e2a``: the FFN rank's results back to the attention ranks (the prior art's
    schema)."""

    OP: ClassVar[str] = "e2a"
    RETURNS: ClassVar[str] = "Tensor"
    expand_x: torch.Tensor
    atten_batch_size: torch.Tensor
    batch_size: int = 0
    hidden_size: int = 0
    topk: int = 0
    expert_rank_size: int = 0
    attention_rank_size: int = 0
    rank: int = 0
    group_ep: str = ""
    aiv_num: int = 0


@dataclass(frozen=True)
class DispatchSend(OpArgs):
    """``afd_async_dispatch_send``: an attention rank's routed rows to the FFN ranks."""

    OP: ClassVar[str] = "afd_async_dispatch_send"
    RETURNS: ClassVar[str] = "Tensor"
    x: torch.Tensor
    expert_ids: torch.Tensor
    comm_args: torch.Tensor
    comm_id: int
    max_seq_len: int
    batch_size: int
    hidden_size: int
    top_k: int
    moe_rank_num: int
    attn_rank_num: int
    route_expert_num_per_moe: int
    attn_rank_id: int
    world_size: int
    layer_index: int
    tp_size: int
    dynamic_quant: int
    group_name: str


@dataclass(frozen=True)
class DispatchRecv(OpArgs):
    """``afd_async_dispatch_recv``: an FFN rank takes the dispatched rows."""

    OP: ClassVar[str] = "afd_async_dispatch_recv"
    RETURNS: ClassVar[str] = "Tensor[]"
    x: torch.Tensor
    comm_args: torch.Tensor
    comm_id: int
    max_seq_len: int
    hidden_size: int
    top_k: int
    moe_rank_num: int
    attn_rank_num: int
    route_expert_num_per_moe: int
    moe_rank_id: int
    world_size: int
    tp_size: int
    dynamic_quant: int
    group_name: str


@dataclass(frozen=True)
class CombineSend(OpArgs):
    """``afd_async_combine_send``: an FFN rank's expert outputs back."""

    OP: ClassVar[str] = "afd_async_combine_send"
    RETURNS: ClassVar[str] = "Tensor"
    expand_x: torch.Tensor
    comm_args: torch.Tensor
    batch_info: torch.Tensor
    comm_id: int
    max_seq_len: int
    hidden_size: int
    top_k: int
    moe_rank_num: int
    attn_rank_num: int
    route_expert_num_per_moe: int
    moe_rank_id: int
    world_size: int
    tp_size: int
    group_name: str


@dataclass(frozen=True)
class CombineRecv(OpArgs):
    """``afd_async_combine_recv``: an attention rank combines the expert outputs."""

    OP: ClassVar[str] = "afd_async_combine_recv"
    RETURNS: ClassVar[str] = "Tensor"
    expand_x: torch.Tensor
    expert_ids: torch.Tensor
    expert_scales: torch.Tensor
    comm_args: torch.Tensor
    comm_id: int
    batch_size: int
    hidden_size: int
    top_k: int
    moe_rank_num: int
    attn_rank_num: int
    route_expert_num_per_moe: int
    attn_rank_id: int
    world_size: int
    group_name: str


#: The argument dataclass of every op by op name, in definition order.
OP_ARGS: dict[str, type[OpArgs]] = {
    args.OP: args for args in (A2E, E2A, DispatchSend, DispatchRecv, CombineSend, CombineRecv)
}

#: Every schema by op name, in definition order.
SCHEMAS: dict[str, str] = {name: args.schema() for name, args in OP_ARGS.items()}

#: Fields of the CAM async ``batch_info`` before its per-tp and per-(expert, tp) counts.
BATCH_INFO_FIELDS = 5


def batch_info_size(tp_size: int, route_expert_num_per_moe: int) -> int:
    """Length of the int64 ``batch_info`` that ``afd_async_dispatch_recv`` returns:
    :data:`BATCH_INFO_FIELDS`, one count per tp rank, one per (local expert, tp rank)."""
    return BATCH_INFO_FIELDS + tp_size + route_expert_num_per_moe * tp_size


def dispatch_capacity(max_seq_len: int, top_k: int, route_expert_num_per_moe: int) -> int:
    """Rows of the ``expanded`` buffer ``afd_async_dispatch_recv`` returns (ours): the most
    routed rows one dispatch can carry, ``max_seq_len`` tokens each picking at most
    ``min(top_k, route_expert_num_per_moe)`` of this FFN rank's experts."""
    return max_seq_len * min(top_k, route_expert_num_per_moe)


def blocks_per_ffn_rank(attention_rank_size: int, expert_rank_size: int) -> int:
    """``ceil(A / F)``: the length of ``atten_batch_size`` (the largest block of attention
    ranks one FFN rank serves). ValueError unless both counts are positive."""
    if expert_rank_size < 1 or attention_rank_size < 1:
        raise ValueError(
            f"afd_ascend: expert_rank_size ({expert_rank_size}) and attention_rank_size "
            f"({attention_rank_size}) must be positive; pass the world's FFN and attention "
            "rank counts"
        )
    return -(-attention_rank_size // expert_rank_size)
