"""Byte formats on the wire: control messages, headers and their checks, step assembly (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from afd_core.connector import WireSpec
from afd_core.errors import AFDProtocolError
from afd_core.runtime.control.step_merger import StepMerger
from afd_core.topology import Topology
from afd_core.wire import (
    CONTROL_MESSAGE_BYTES,
    HEADER_BYTES,
    HeaderCodec,
    decode_control_message,
    decode_step_message,
    describe_rank,
    encode_control_message,
    encode_step_message,
    raise_header_mismatch,
    step_message_bytes,
)
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload, TransferHeader

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


def packed(codec: HeaderCodec, *args: object, **kwargs: int) -> TransferHeader:
    """The header ``codec.pack_into`` writes for these values, decoded from its bytes."""
    buffer = memoryview(bytearray(HEADER_BYTES))
    codec.pack_into(buffer, 0, *args, **kwargs)  # type: ignore[arg-type]
    return TransferHeader.decode(bytes(buffer))


def payload(rank: int, step: int, *counts: int, first: int | None = None) -> ControlPayload:
    first = rank if first is None else first
    return ControlPayload(step, rank, tuple(AFDDPMetadata(first, (n,)) for n in counts))


def test_control_messages_have_a_fixed_size_and_round_trip():
    p = payload(3, 11, 5, 0)
    message = encode_control_message(p)
    assert len(message) == CONTROL_MESSAGE_BYTES
    assert decode_control_message(message) == p


def test_a_payload_too_large_for_a_control_message_is_refused_before_sending():
    big = ControlPayload(0, 0, (AFDDPMetadata(0, tuple(range(200))),))
    with pytest.raises(AFDProtocolError, match="send the counts of this rank only"):
        encode_control_message(big)


def test_control_messages_of_wrong_size_or_impossible_length_are_rejected():
    message = encode_control_message(payload(0, 0, 1))
    with pytest.raises(AFDProtocolError, match="control message is 511 bytes"):
        decode_control_message(message[:-1])
    with pytest.raises(AFDProtocolError, match="announces a 0-byte payload"):
        decode_control_message(b"\0" * CONTROL_MESSAGE_BYTES)
    with pytest.raises(AFDProtocolError, match="bad magic"):
        decode_control_message(message[:8] + b"XXXX" + message[12:])


@pytest.mark.parametrize("wire", [WIRE, GATE, DENSE_FIRST])
@pytest.mark.parametrize("direction", ["a2f", "f2a"])
@pytest.mark.parametrize(("logits_width", "topk"), [(0, 0), (16, 0), (0, 8)])
def test_packed_headers_equal_the_encoded_dataclasses(wire, direction, logits_width, topk):
    codec = HeaderCodec(wire)
    buffer = memoryview(bytearray(130))
    codec.pack_into(buffer, 3, direction, 7, 1, 1, 12, 2, logits_width=logits_width, topk=topk)
    header = TransferHeader(
        direction=direction,
        step_id=7,
        layer=1,
        stage=1,
        num_tokens=12,
        dtype=wire.dtype,
        hidden_size=wire.hidden_size,
        sender_rank=2,
        logits_width=logits_width,
        logits_dtype=wire.router_logits_dtype if logits_width else "float32",
        topk=topk,
    )
    assert bytes(buffer[3:67]) == header.encode()
    assert TransferHeader.decode(bytes(buffer[3:67])) == header
    assert packed(codec, direction, 7, 1, 1, 12, 2, logits_width=logits_width, topk=topk) == header


def test_dense_layers_carry_no_router_logits_even_with_the_gate_on_attention():
    assert [DENSE_FIRST.logits_width_at(layer) for layer in (0, 1)] == [0, 16]
    assert [WIRE.logits_width_at(layer) for layer in (0, 1)] == [0, 0]


def test_exchange_layers_default_to_every_layer_and_may_be_named():
    assert WIRE.exchange_layers == (0, 1, 2, 3)
    moe_only = replace(WIRE, num_exchange_layers=2, exchange_layer_ids=(1, 3))
    assert moe_only.exchange_layers == (1, 3)
    with pytest.raises(ValueError, match="name 1 layers, num_exchange_layers is 4"):
        replace(WIRE, exchange_layer_ids=(1,))


def test_a_header_mismatch_names_the_sender_and_both_views():
    codec = HeaderCodec(WIRE)
    expected = packed(codec, "a2f", 5, 0, 0, 2, 0)
    sent = packed(codec, "a2f", 5, 1, 0, 2, 0)
    with pytest.raises(AFDProtocolError) as err:
        raise_header_mismatch(sent.encode(), expected, "attention rank 0")
    assert "layer: received 1, expected 0" in str(err.value)
    assert "[sent by attention rank 0]" in str(err.value)
    raise_header_mismatch(expected.encode(), expected, "attention rank 0")  # equal: no error


def test_a_header_mismatch_may_leave_fields_out():
    codec = HeaderCodec(WIRE)
    expected = packed(codec, "a2f", 5, 0, 0, 2, 0)
    raise_header_mismatch(packed(codec, "a2f", 5, 0, 0, 9, 0).encode(), expected, "x",
                          ignore=("num_tokens",))  # fmt: skip
    with pytest.raises(AFDProtocolError, match="step_id: received 6, expected 5"):
        raise_header_mismatch(packed(codec, "a2f", 6, 0, 0, 9, 0).encode(), expected, "x",
                              ignore=("num_tokens",))  # fmt: skip


def test_describe_rank_gives_role_rank_and_world_rank():
    topo = Topology(3, 2)
    assert describe_rank(topo, "ffn", 1) == "FFN rank 1 (world rank 1)"
    assert describe_rank(topo, "attention", 2) == "attention rank 2 (world rank 4)"


def test_a_step_takes_the_ready_ranks_in_block_order():
    merger = StepMerger(range(2, 5))
    step = merger.merge({4: payload(4, 9, 1), 2: payload(2, 0, 3)})
    assert step.attention_ranks == (2, 4)
    assert step.tokens == ((3,), (1,))
    assert [p.step_id for p in step.payloads] == [0, 9]


def test_step_ids_of_each_rank_must_increase_by_one():
    merger = StepMerger(range(2))
    merger.merge({0: payload(0, 5, 1)})
    merger.merge({0: payload(0, 6, 1), 1: payload(1, 40, 2)})  # rank 1 starts anywhere
    with pytest.raises(AFDProtocolError, match="attention rank 0 sent step 8 after step 6"):
        merger.merge({0: payload(0, 8, 1)})
    with pytest.raises(AFDProtocolError, match="sent step 40 after step 40"):
        merger.merge({1: payload(1, 40, 1)})
    merger.merge({0: payload(0, 7, 1)})  # a refused step changes nothing


def test_ranks_of_one_step_must_run_the_same_number_of_stages():
    merger = StepMerger(range(2))
    with pytest.raises(AFDProtocolError, match=r"attention rank 0 runs 1 stage.*rank 1 runs 2"):
        merger.merge({0: payload(0, 0, 1), 1: payload(1, 0, 1, 1)})


def test_payloads_from_outside_the_block_or_signed_by_another_rank_are_rejected():
    merger = StepMerger(range(2))
    with pytest.raises(
        AFDProtocolError,
        match=r"attention ranks \[2\] reached an FFN rank "
        r"serving \[0, 1\]",
    ):
        merger.merge({2: payload(2, 0, 1)})
    with pytest.raises(AFDProtocolError, match="signed by attention rank 0"):
        merger.merge({1: ControlPayload(0, 0, (AFDDPMetadata(0, (1, 1)),))})


def test_a_payload_of_a_whole_dp_group_yields_this_ranks_counts():
    merger = StepMerger(range(1, 2))
    group = ControlPayload(0, 1, (AFDDPMetadata(0, (4, 6, 8)),))
    assert merger.merge({1: group}).tokens == ((6,),)


def test_step_messages_carry_every_payload_of_a_step_and_its_generation_in_a_fixed_size():
    payloads = (payload(0, 4, 3), payload(2, 9, 1, 2))
    message = encode_step_message(payloads, (0, 7), 3)
    assert len(message) == step_message_bytes(3) == 8 + 3 * (8 + CONTROL_MESSAGE_BYTES)
    assert decode_step_message(message, 3) == ((payloads[0], 0), (payloads[1], 7))


def test_step_messages_of_another_size_count_or_generation_are_refused():
    with pytest.raises(ValueError, match="one generation per payload"):
        encode_step_message((payload(0, 0, 1),), (), 2)
    with pytest.raises(AFDProtocolError, match="generation -1"):
        decode_step_message(encode_step_message((payload(0, 0, 1),), (-1,), 2), 2)
    message = encode_step_message((payload(0, 0, 1),), (0,), 2)
    with pytest.raises(AFDProtocolError, match="step message is"):
        decode_step_message(message, 3)
    with pytest.raises(AFDProtocolError, match="announces 0 payloads for 2"):
        decode_step_message(b"\0" * step_message_bytes(2), 2)
