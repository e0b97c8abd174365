"""Byte codecs of ControlPayload and TransferHeader, and header checks (pure Python)."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from afd_core.errors import AFDProtocolError
from afd_core.wire.metadata import (
    AFDDPMetadata,
    AFDStepMetadata,
    ControlPayload,
    TransferHeader,
)

PAYLOADS = [
    ControlPayload(0, 0, (AFDDPMetadata(0, (1,)),)),
    ControlPayload(
        2**40,
        3,
        (AFDDPMetadata(2, (0, 7)), AFDDPMetadata(2, (5, 0))),
        is_warmup=True,
        is_profile=True,
    ),
    ControlPayload(17, 1, (AFDDPMetadata(1, (256,)),), is_graph_capturing=True, is_graph_step=True),
    ControlPayload(18, 0, (AFDDPMetadata(0, (8,)),), is_graph_step=True),
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_control_payload_round_trips_through_bytes(payload):
    assert ControlPayload.decode(payload.encode()) == payload


def test_control_payload_reports_each_rank_per_stage():
    payload = PAYLOADS[1]
    assert payload.tokens_of(2) == (0, 5)
    assert payload.tokens_of(3) == (7, 0)
    with pytest.raises(AFDProtocolError, match=r"covers attention ranks 2\.\.3, not 4"):
        payload.tokens_of(4)


def test_short_control_payload_is_rejected():
    with pytest.raises(AFDProtocolError, match="shorter than its 28-byte header"):
        ControlPayload.decode(PAYLOADS[0].encode()[:10])


def test_control_payload_with_bad_magic_is_rejected():
    data = bytearray(PAYLOADS[0].encode())
    data[:4] = b"AFDT"
    with pytest.raises(AFDProtocolError, match="bad magic b'AFDT'"):
        ControlPayload.decode(bytes(data))


def test_control_payload_of_another_version_is_rejected():
    data = bytearray(PAYLOADS[0].encode())
    struct.pack_into("<H", data, 4, ControlPayload.VERSION + 1)
    with pytest.raises(AFDProtocolError, match="install the same afd-core version"):
        ControlPayload.decode(bytes(data))


@pytest.mark.parametrize("cut", [-4, 4])
def test_control_payload_whose_length_disagrees_with_its_header_is_rejected(cut):
    data = PAYLOADS[1].encode()
    data = data[:cut] if cut < 0 else data + b"\0" * cut
    with pytest.raises(AFDProtocolError, match="its header announces"):
        ControlPayload.decode(data)


def test_control_payload_stages_must_cover_the_same_ranks():
    with pytest.raises(ValueError, match="same attention ranks"):
        ControlPayload(0, 0, (AFDDPMetadata(0, (1,)), AFDDPMetadata(1, (1,))))
    with pytest.raises(ValueError, match="negative token count"):
        ControlPayload(0, 0, (AFDDPMetadata(0, (-1,)),))


HEADER = TransferHeader("a2f", 41, 7, 1, 12, "bfloat16", 2048, 3, 64, "float32")


@pytest.mark.parametrize("header", [HEADER, TransferHeader("f2a", 0, 0, 0, 0, "float16", 8, 0)])
def test_transfer_header_round_trips_in_64_bytes(header):
    data = header.encode()
    assert len(data) == TransferHeader.SIZE == 64
    assert TransferHeader.decode(data) == header


def test_transfer_header_of_wrong_size_bad_magic_or_version_is_rejected():
    data = HEADER.encode()
    with pytest.raises(AFDProtocolError, match="header is 63 bytes"):
        TransferHeader.decode(data[:63])
    with pytest.raises(AFDProtocolError, match="bad magic"):
        TransferHeader.decode(b"AFDC" + data[4:])
    bumped = bytearray(data)
    struct.pack_into("<H", bumped, 4, TransferHeader.VERSION + 1)
    with pytest.raises(AFDProtocolError, match=f"header version {TransferHeader.VERSION + 1}"):
        TransferHeader.decode(bytes(bumped))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("direction", "f2a"),
        ("step_id", 42),
        ("layer", 8),
        ("stage", 0),
        ("num_tokens", 13),
        ("dtype", "float16"),
        ("hidden_size", 1024),
        ("sender_rank", 2),
        ("logits_width", 32),
        ("logits_dtype", "bfloat16"),
    ],
)
def test_header_check_names_the_differing_field_with_both_values(field, value):
    received = replace(HEADER, **{field: value})
    with pytest.raises(AFDProtocolError) as err:
        received.check(HEADER)
    assert f"{field}: received {value!r}, expected {getattr(HEADER, field)!r}" in str(err.value)
    HEADER.check(HEADER)  # an equal header passes


def test_header_check_ignores_logits_dtype_when_no_logits_travel():
    bare = replace(HEADER, logits_width=0)
    replace(bare, logits_dtype="bfloat16").check(bare)


def test_header_rejects_unknown_direction_or_dtype():
    with pytest.raises(ValueError, match="direction"):
        replace(HEADER, direction="x2y")
    with pytest.raises(ValueError, match="float64"):
        replace(HEADER, dtype="float64")


def test_step_metadata_of_a_single_stage_forward():
    meta = AFDStepMetadata.single_stage(5, 3)
    assert meta.num_stages == 1
    assert (meta.step_id, meta.padded_lens, meta.stage_index) == (5, (3,), 0)
    with pytest.raises(ValueError, match=r"negative token count in \(-1,\)"):
        AFDStepMetadata.single_stage(5, -1)


def test_control_payload_capturing_outside_a_graph_step_is_rejected():
    with pytest.raises(ValueError, match="a capturing step is a graph step"):
        ControlPayload(1, 0, (AFDDPMetadata(0, (4,)),), is_graph_capturing=True)
    data = bytearray(PAYLOADS[2].encode())
    data[6] = 2  # flags: capturing, graph-step bit cleared
    with pytest.raises(AFDProtocolError, match="flags a CUDA graph capture that is not a graph"):
        ControlPayload.decode(bytes(data))
