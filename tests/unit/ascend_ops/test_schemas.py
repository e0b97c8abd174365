"""The op schemas are the prior art's strings (a call site written for the compiled
kernels runs unchanged on the reference ones). No torch needed."""

from __future__ import annotations

import pytest

from afd_ascend_ops.schemas import (
    SCHEMAS,
    batch_info_size,
    blocks_per_ffn_rank,
    dispatch_capacity,
)

PRIOR_ART_A2E = """a2e(Tensor x, Tensor? expert_ids=None, Tensor? scales=None, int batch_size=0,
    int hidden_size=0, int topk=0, int expert_rank_size=0, int attention_rank_size=0, int rank=0,
    str group_ep='', int aiv_num=0, int compute_gate=0) -> Tensor[]"""
PRIOR_ART_E2A = """e2a(Tensor expand_x, Tensor atten_batch_size, int batch_size=0,
    int hidden_size=0, int topk=0, int expert_rank_size=0, int attention_rank_size=0,
    int rank=0, str group_ep='', int aiv_num=0) -> Tensor"""


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_a2e_and_e2a_are_exactly_the_prior_arts_schemas():
    assert SCHEMAS["a2e"] == one_line(PRIOR_ART_A2E)
    assert SCHEMAS["e2a"] == one_line(PRIOR_ART_E2A)


def test_a_record_of_an_ops_arguments_takes_what_the_dispatcher_passes():
    from afd_ascend_ops.schemas import A2E, OP_ARGS

    # The dispatcher drops trailing arguments equal to their defaults; the record has them.
    assert A2E("x", None, None, 4).hidden_size == 0 and A2E("x").group_ep == ""
    assert [args.schema() for args in OP_ARGS.values()] == list(SCHEMAS.values())


def test_the_cam_async_ops_are_the_compact_v2_names_without_defaults():
    assert list(SCHEMAS) == [
        "a2e",
        "e2a",
        "afd_async_dispatch_send",
        "afd_async_dispatch_recv",
        "afd_async_combine_send",
        "afd_async_combine_recv",
    ]
    for name in list(SCHEMAS)[2:]:
        assert "=" not in SCHEMAS[name], name
        assert "str group_name)" in SCHEMAS[name]
    assert SCHEMAS["afd_async_dispatch_recv"].endswith("-> Tensor[]")


def test_atten_batch_size_has_one_entry_per_rank_of_the_largest_block():
    assert blocks_per_ffn_rank(2, 1) == 2
    assert blocks_per_ffn_rank(3, 2) == 2
    assert blocks_per_ffn_rank(4, 4) == 1
    with pytest.raises(ValueError, match="expert_rank_size \\(0\\)"):
        blocks_per_ffn_rank(2, 0)


def test_cam_async_buffer_sizes():
    assert batch_info_size(tp_size=2, route_expert_num_per_moe=3) == 5 + 2 + 6
    assert dispatch_capacity(max_seq_len=64, top_k=8, route_expert_num_per_moe=3) == 192
    assert dispatch_capacity(max_seq_len=64, top_k=2, route_expert_num_per_moe=3) == 128
