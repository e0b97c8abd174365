"""Byte-level P2P protocol: control frames, header packing, step assembly (pure Python)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from afd_core.connector import WireSpec
from afd_core.connectors.p2p_wire import (
    CONTROL_FRAME_BYTES,
    HeaderPacker,
    StepAssembler,
    a2f_header,
    check_received,
    decode_control_frame,
    describe_rank,
    encode_control_frame,
    f2a_header,
    hidden_nbytes,
    logits_nbytes,
    with_layer,
)
from afd_core.errors import AFDProtocolError
from afd_core.metadata import AFDDPMetadata, ControlPayload
from afd_core.topology import Topology

WIRE = WireSpec(hidden_size=2048, dtype="bfloat16", num_exchange_layers=4)
GATE = WireSpec(
    hidden_size=64,
    dtype="float16",
    num_exchange_layers=2,
    router_logits_width=16,
    router_logits_dtype="bfloat16",
)
# DeepSeek-like: layer 0 has a dense MLP (no router), layer 1 is sparse.
DENSE_FIRST = replace(GATE, dense_layers=(0,))


def payload(rank: int, step: int, *counts: int, first: int | None = None) -> ControlPayload:
    first = rank if first is None else first
    return ControlPayload(step, rank, tuple(AFDDPMetadata(first, (n,)) for n in counts))


def test_control_frames_have_a_fixed_size_and_round_trip():
    p = payload(3, 11, 5, 0)
    frame = encode_control_frame(p)
    assert len(frame) == CONTROL_FRAME_BYTES
    assert decode_control_frame(frame) == p


def test_a_payload_too_large_for_a_frame_is_refused_before_sending():
    big = ControlPayload(0, 0, (AFDDPMetadata(0, tuple(range(200))),))
    with pytest.raises(AFDProtocolError, match="send the counts of this rank only"):
        encode_control_frame(big)


def test_frames_of_wrong_size_or_impossible_length_are_rejected():
    frame = encode_control_frame(payload(0, 0, 1))
    with pytest.raises(AFDProtocolError, match="frame is 511 bytes"):
        decode_control_frame(frame[:-1])
    with pytest.raises(AFDProtocolError, match="announces a 0-byte payload"):
        decode_control_frame(b"\0" * CONTROL_FRAME_BYTES)
    with pytest.raises(AFDProtocolError, match="bad magic"):
        decode_control_frame(frame[:8] + b"XXXX" + frame[12:])


@pytest.mark.parametrize("wire", [WIRE, GATE, DENSE_FIRST])
@pytest.mark.parametrize("layer", [0, 1])
def test_packed_headers_equal_the_encoded_dataclasses(wire, layer):
    packer = HeaderPacker(wire)
    assert packer.a2f(7, layer, 1, 12, 2) == a2f_header(7, layer, 1, 12, 2, wire).encode()
    assert packer.f2a(7, layer, 1, 12, 0) == f2a_header(7, layer, 1, 12, 0, wire).encode()


def test_dense_layers_carry_no_router_logits_even_with_the_gate_on_attention():
    assert a2f_header(0, 0, 0, 4, 0, DENSE_FIRST).logits_width == 0
    assert a2f_header(0, 1, 0, 4, 0, DENSE_FIRST).logits_width == 16
    assert [DENSE_FIRST.logits_width_at(layer) for layer in (0, 1)] == [0, 16]


def test_with_layer_equals_replace_and_leaves_the_template_alone():
    template = a2f_header(7, 0, 1, 12, 2, GATE)
    assert with_layer(template, 5) == replace(template, layer=5)
    assert template.layer == 0


def test_a2f_headers_carry_logits_only_when_the_gate_runs_on_attention():
    assert a2f_header(0, 0, 0, 4, 0, WIRE).logits_width == 0
    gated = a2f_header(0, 0, 0, 4, 0, GATE)
    assert (gated.logits_width, gated.logits_dtype) == (16, "bfloat16")
    assert f2a_header(0, 0, 0, 4, 0, GATE).logits_width == 0


def test_message_sizes_follow_the_wire_spec():
    assert hidden_nbytes(3, WIRE) == 3 * 2048 * 2
    assert logits_nbytes(3, WIRE) == 0
    assert logits_nbytes(3, GATE) == 3 * 16 * 2


def test_check_received_names_the_sender_and_both_views():
    expected = a2f_header(5, 0, 0, 2, 0, WIRE)
    with pytest.raises(AFDProtocolError) as err:
        check_received(a2f_header(5, 1, 0, 2, 0, WIRE).encode(), expected, "attention rank 0")
    assert "layer: received 1, expected 0" in str(err.value)
    assert "[sent by attention rank 0]" in str(err.value)
    check_received(expected.encode(), expected, "attention rank 0")


def test_describe_rank_gives_role_rank_and_world_rank():
    topo = Topology(3, 2)
    assert describe_rank(topo, "ffn", 1) == "FFN rank 1 (world rank 1)"
    assert describe_rank(topo, "attention", 2) == "attention rank 2 (world rank 4)"


def test_a_step_takes_the_ready_ranks_in_block_order():
    assembler = StepAssembler(range(2, 5))
    step = assembler.assemble({4: payload(4, 9, 1), 2: payload(2, 0, 3)})
    assert step.attention_ranks == (2, 4)
    assert step.tokens == ((3,), (1,))
    assert [p.step_id for p in step.payloads] == [0, 9]


def test_step_ids_of_each_rank_must_increase_by_one():
    assembler = StepAssembler(range(2))
    assembler.assemble({0: payload(0, 5, 1)})
    assembler.assemble({0: payload(0, 6, 1), 1: payload(1, 40, 2)})  # rank 1 starts anywhere
    with pytest.raises(AFDProtocolError, match="attention rank 0 sent step 8 after step 6"):
        assembler.assemble({0: payload(0, 8, 1)})
    with pytest.raises(AFDProtocolError, match="sent step 40 after step 40"):
        assembler.assemble({1: payload(1, 40, 1)})
    assembler.assemble({0: payload(0, 7, 1)})  # a refused step changes nothing


def test_ranks_of_one_step_must_run_the_same_number_of_stages():
    assembler = StepAssembler(range(2))
    with pytest.raises(AFDProtocolError, match=r"attention rank 0 runs 1 stage.*rank 1 runs 2"):
        assembler.assemble({0: payload(0, 0, 1), 1: payload(1, 0, 1, 1)})


def test_payloads_from_outside_the_block_or_signed_by_another_rank_are_rejected():
    assembler = StepAssembler(range(2))
    with pytest.raises(
        AFDProtocolError,
        match=r"attention ranks \[2\] reached an FFN rank "
        r"serving \[0, 1\]",
    ):
        assembler.assemble({2: payload(2, 0, 1)})
    with pytest.raises(AFDProtocolError, match="signed by attention rank 0"):
        assembler.assemble({1: ControlPayload(0, 0, (AFDDPMetadata(0, (1, 1)),))})


def test_a_payload_of_a_whole_dp_group_yields_this_ranks_counts():
    assembler = StepAssembler(range(1, 2))
    group = ControlPayload(0, 1, (AFDDPMetadata(0, (4, 6, 8)),))
    assert assembler.assemble({1: group}).tokens == ((6,),)
