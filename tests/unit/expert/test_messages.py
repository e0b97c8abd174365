"""The expert-routed messages: reply frames and the reused header buffers (CPU memory)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import WireSpec  # noqa: E402
from afd_core.metadata import TransferHeader  # noqa: E402
from afd_core.runtime.expert.messages import (  # noqa: E402
    HeaderedBuffer,
    read_header,
    reply_bytes,
    reply_partial,
)
from afd_core.wire import HEADER_BYTES, HeaderCodec  # noqa: E402
from tests.unit.core.loopback import Fabric, LoopbackTransport  # noqa: E402

WIRE = WireSpec(hidden_size=8, dtype="bfloat16", num_exchange_layers=2, num_experts=4, top_k=2)


def test_a_reply_frame_is_the_header_then_the_partial_rows():
    assert reply_bytes(0, WIRE) == HEADER_BYTES
    assert reply_bytes(3, WIRE) == HEADER_BYTES + 3 * 8 * 2
    frame = torch.zeros(reply_bytes(3, WIRE), dtype=torch.uint8)
    partial = reply_partial(frame, 3, WIRE)
    assert partial.shape == (3, 8) and partial.dtype == torch.bfloat16
    partial.fill_(1.5)
    assert not frame[:HEADER_BYTES].any()  # the header bytes are untouched
    assert partial.data_ptr() == frame.data_ptr() + HEADER_BYTES


def test_a_header_buffer_keeps_zero_padding_when_headers_are_packed_again():
    transport, codec = LoopbackTransport(Fabric(), 0, "data"), HeaderCodec(WIRE)
    buffer = HeaderedBuffer(transport, 256)
    assert not buffer.tensor[:HEADER_BYTES].any()
    buffer.tensor[HEADER_BYTES:].fill_(0xFF)  # bodies after the header change nothing in it
    for step_id, rows in ((7, 5), (8, 0)):
        codec.pack_into(buffer.header, 0, "a2f", step_id, 1, 0, rows, 0, topk=2)
        buffer.publish_header()
        raw = read_header(transport, buffer.tensor)
        assert raw == codec.header("a2f", step_id, 1, 0, rows, 0, topk=2).encode()
        assert codec.num_tokens_of(raw) == rows
        assert TransferHeader.decode(raw).step_id == step_id
    assert buffer.nbytes == 256
