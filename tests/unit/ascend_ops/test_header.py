"""The message header of the reference kernels: wire form, parsing, differences."""

from __future__ import annotations

import pytest

from afd_ascend_ops.header import OpsHeader
from afd_core.errors import AFDProtocolError

HEADER = OpsHeader("a2e", 7, 2, 0, 5, 4096, "bfloat16", topk=8, gated=True)


def test_a_header_round_trips_through_its_fixed_size_wire_form():
    raw = HEADER.encode()
    assert len(raw) == OpsHeader.SIZE == 64
    assert OpsHeader.decode(raw) == HEADER
    plain = OpsHeader("e2a", 2**40, 0, 9, 0, 16, "float32")
    assert OpsHeader.decode(plain.encode()) == plain


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (HEADER.encode()[:63], "this message has 63"),
        (b"XXXX" + HEADER.encode()[4:], "not the header magic"),
        (HEADER.encode()[:4] + b"\x09\x00" + HEADER.encode()[6:], "header version 9"),
        (HEADER.encode()[:6] + b"\x05" + HEADER.encode()[7:], "unknown op code 5"),
    ],
)
def test_anything_but_a_header_of_this_version_is_a_protocol_error(raw, says):
    with pytest.raises(AFDProtocolError, match=says):
        OpsHeader.decode(raw)


def test_differences_name_both_values_of_every_differing_field():
    other = OpsHeader("a2e", 6, 2, 0, 3, 2048, "float16", topk=8, gated=True)
    assert HEADER.differences(other) == [
        "seq: sent 7, expected 6",
        "rows: sent 5, expected 3",
        "hidden_size: sent 4096, expected 2048",
        "dtype: sent 'bfloat16', expected 'float16'",
    ]
    assert HEADER.differences(other, ignore=("rows", "seq", "hidden_size", "dtype")) == []


def test_a_header_refuses_an_unknown_op_or_dtype():
    with pytest.raises(ValueError, match="op must be one of"):
        OpsHeader("scatter", 0, 0, 1, 0, 8, "bfloat16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int8"):
        OpsHeader("a2e", 0, 0, 1, 0, 8, "int8")
