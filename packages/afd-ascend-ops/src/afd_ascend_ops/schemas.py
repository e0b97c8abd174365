"""The schemas of the ``afd_ascend`` torch ops: the one place they are written.

* ``a2e`` / ``e2a``: the CAM P2P exchange (attention to experts, experts to attention),
  exactly the prior art's strings (argument names, order and defaults), so a call site
  written for the compiled Ascend kernels runs unchanged on the CPU reference kernels.
* ``afd_async_dispatch_send`` / ``_recv``, ``afd_async_combine_send`` / ``_recv``: the
  CAM async ops in their "compact v2" form (routed experts only; no defaults), with the
  argument order of the compiled kernels they stand for. The README says what each
  argument means and where the meaning is ours.

Pure Python: no torch. :mod:`afd_ascend_ops.ops` defines them with ``torch.library``.
"""

from __future__ import annotations

#: The namespace of every op: ``torch.ops.afd_ascend.<name>``.
NAMESPACE = "afd_ascend"

A2E = (
    "a2e(Tensor x, Tensor? expert_ids=None, Tensor? scales=None, int batch_size=0, "
    "int hidden_size=0, int topk=0, int expert_rank_size=0, int attention_rank_size=0, "
    "int rank=0, str group_ep='', int aiv_num=0, int compute_gate=0) -> Tensor[]"
)
E2A = (
    "e2a(Tensor expand_x, Tensor atten_batch_size, int batch_size=0, int hidden_size=0, "
    "int topk=0, int expert_rank_size=0, int attention_rank_size=0, int rank=0, "
    "str group_ep='', int aiv_num=0) -> Tensor"
)
DISPATCH_SEND = (
    "afd_async_dispatch_send(Tensor x, Tensor expert_ids, Tensor comm_args, int comm_id, "
    "int max_seq_len, int batch_size, int hidden_size, int top_k, int moe_rank_num, "
    "int attn_rank_num, int route_expert_num_per_moe, int attn_rank_id, int world_size, "
    "int layer_index, int tp_size, int dynamic_quant, str group_name) -> Tensor"
)
DISPATCH_RECV = (
    "afd_async_dispatch_recv(Tensor x, Tensor comm_args, int comm_id, int max_seq_len, "
    "int hidden_size, int top_k, int moe_rank_num, int attn_rank_num, "
    "int route_expert_num_per_moe, int moe_rank_id, int world_size, int tp_size, "
    "int dynamic_quant, str group_name) -> Tensor[]"
)
COMBINE_SEND = (
    "afd_async_combine_send(Tensor expand_x, Tensor comm_args, Tensor batch_info, "
    "int comm_id, int max_seq_len, int hidden_size, int top_k, int moe_rank_num, "
    "int attn_rank_num, int route_expert_num_per_moe, int moe_rank_id, int world_size, "
    "int tp_size, str group_name) -> Tensor"
)
COMBINE_RECV = (
    "afd_async_combine_recv(Tensor expand_x, Tensor expert_ids, Tensor expert_scales, "
    "Tensor comm_args, int comm_id, int batch_size, int hidden_size, int top_k, "
    "int moe_rank_num, int attn_rank_num, int route_expert_num_per_moe, int attn_rank_id, "
    "int world_size, str group_name) -> Tensor"
)

#: Every schema by op name, in definition order.
SCHEMAS: dict[str, str] = {
    schema.split("(", 1)[0]: schema
    for schema in (A2E, E2A, DISPATCH_SEND, DISPATCH_RECV, COMBINE_SEND, COMBINE_RECV)
}

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
