"""The message forms of :mod:`afd_core.runtime.messages`: each form's round trip over a
loopback transport, the one header writer and check, the posting orders."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import WireSpec  # noqa: E402
from afd_core.errors import AFDProtocolError  # noqa: E402
from afd_core.runtime.messages.forms import (  # noqa: E402
    RECEIVES_FIRST,
    SENDS_FIRST,
    headed,
    posting_order,
)
from afd_core.runtime.messages.frames import FrameBuffer, FrameLayout, memmove  # noqa: E402
from afd_core.wire import HEADER_BYTES  # noqa: E402
from afd_core.wire.headers import (  # noqa: E402
    HeaderedBuffer,
    HeaderWriter,
    IncomingHeaders,
    MessageHeader,
    OutgoingHeaders,
    read_header,
)
from afd_core.wire.metadata import TransferHeader  # noqa: E402
from tests.unit.core.loopback import ExactLoopbackTransport, Fabric, LoopbackTransport  # noqa: E402

#: Two exchange layers, the gate on attention: A2F messages carry router logits.
WIRE = WireSpec(
    hidden_size=6,
    dtype="bfloat16",
    num_exchange_layers=2,
    router_logits_width=3,
    router_logits_dtype="float32",
)
ATTENTION, FFN = 1, 0  # world ranks on the loopback fabric
STEP, TOKENS = 7, 4


def step_headers(transport, sender: str) -> tuple[OutgoingHeaders, IncomingHeaders]:
    """An attention rank's rows of a one-stage step: A2F sent, F2A expected (as the FFN
    rank's rows are written, the other way round)."""
    outgoing, incoming = OutgoingHeaders(transport, 2), IncomingHeaders(transport, 2, sender)
    HeaderWriter(WIRE).write_stage(outgoing.view, incoming.view, STEP, 0, TOKENS, 0, 0)
    outgoing.publish()
    incoming.publish()
    return outgoing, incoming


def ffn_headers(transport) -> tuple[IncomingHeaders, OutgoingHeaders]:
    incoming = IncomingHeaders(transport, 2, "attention rank 0")
    outgoing = OutgoingHeaders(transport, 2)
    HeaderWriter(WIRE).write_stage(incoming.view, outgoing.view, STEP, 0, TOKENS, 0, 0)
    incoming.publish()
    outgoing.publish()
    return incoming, outgoing


def tensors() -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.arange(TOKENS * 6, dtype=torch.bfloat16).view(TOKENS, 6)
    return hidden, torch.arange(TOKENS * 3, dtype=torch.float32).view(TOKENS, 3) / 8


def test_a_frame_round_trip_carries_the_header_and_both_tensors_in_one_message():
    fabric = Fabric()
    sender, receiver = (
        LoopbackTransport(fabric, ATTENTION, "d"),
        LoopbackTransport(fabric, FFN, "d"),
    )
    outgoing, _ = step_headers(sender, "FFN rank 0")
    incoming, _ = ffn_headers(receiver)
    layout = FrameLayout.of(WIRE, TOKENS)
    hidden, logits = tensors()
    frame = FrameBuffer().hold(layout)
    memmove(frame.address, outgoing.address(1), HEADER_BYTES)  # layer 1's row
    frame.write_hidden(hidden)
    frame.write_logits(logits)
    landing = FrameBuffer().hold(layout)
    send = sender.post_send(frame.message_with_logits, FFN)
    recv = receiver.post_recv(landing.message_with_logits, ATTENTION)
    sender.wait_all([send], None)
    receiver.wait_all([recv], None)
    incoming.check_at(1, landing.address)
    assert torch.equal(landing.hidden(6, torch.bfloat16), hidden)
    assert torch.equal(landing.logits(3, torch.float32), logits)
    with pytest.raises(AFDProtocolError, match="layer: received 1, expected 0"):
        incoming.check_at(0, landing.address)  # the header names the layer it belongs to


def test_a_headed_round_trip_is_a_header_message_then_the_bare_tensors():
    fabric = Fabric()
    sender = ExactLoopbackTransport(fabric, ATTENTION, "d")
    receiver = ExactLoopbackTransport(fabric, FFN, "d")
    outgoing, _ = step_headers(sender, "FFN rank 0")
    incoming, _ = ffn_headers(receiver)
    hidden, logits = tensors()
    got_hidden, got_logits = torch.empty_like(hidden), torch.empty_like(logits)
    sends = headed(outgoing.row(0), (hidden, logits))
    receives = headed(incoming.row(0), (got_hidden, got_logits))
    assert len(sends) == len(receives) == 3
    out_peer, in_peer = sender.to_peer(FFN, 5.0), receiver.to_peer(ATTENTION, 5.0)
    out_peer.wait_all(SENDS_FIRST.post(out_peer, sends, []))
    in_peer.wait_all(RECEIVES_FIRST.post(in_peer, [], receives))
    incoming.check(0)
    assert torch.equal(got_hidden, hidden) and torch.equal(got_logits, logits)


def test_the_headed_form_sends_no_tensor_without_rows():
    header = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
    assert headed(header, (torch.empty(0, 6), None)) == [header]


def test_a_bare_round_trip_moves_the_tensors_without_a_header():
    fabric = Fabric()
    sender = ExactLoopbackTransport(fabric, ATTENTION, "d")
    receiver = ExactLoopbackTransport(fabric, FFN, "d")
    hidden, logits = tensors()
    got_hidden, got_logits = torch.empty_like(hidden), torch.empty_like(logits)
    out_peer, in_peer = sender.to_peer(FFN, 5.0), receiver.to_peer(ATTENTION, 5.0)
    out_peer.wait_all(posting_order(sender).post(out_peer, [hidden, logits], []))
    in_peer.wait_all(posting_order(receiver).post(in_peer, [], [got_hidden, got_logits]))
    assert torch.equal(got_hidden, hidden) and torch.equal(got_logits, logits)


class _RecordingPeerTransport:
    def __init__(self) -> None:
        self.posted: list[str] = []

    def post_send(self, tensor):
        self.posted.append(f"send {tensor}")

    def post_recv(self, tensor):
        self.posted.append(f"recv {tensor}")


class _Ordered:
    ordered_pairs = True


class _Unordered:
    ordered_pairs = False


def test_ordered_transports_post_sends_first_and_others_receives_first():
    assert posting_order(_Ordered()) is SENDS_FIRST
    assert posting_order(_Unordered()) is RECEIVES_FIRST
    for order, expected in ((SENDS_FIRST, ["send a", "send b", "recv c"]),
                            (RECEIVES_FIRST, ["recv c", "send a", "send b"])):  # fmt: skip
        to_peer = _RecordingPeerTransport()
        order.post(to_peer, ["a", "b"], ["c"])
        assert to_peer.posted == expected


def test_the_step_rows_are_the_headers_of_every_layer_and_direction():
    transport = LoopbackTransport(Fabric(), 0, "d")
    outgoing, incoming = step_headers(transport, "FFN rank 0")
    writer = HeaderWriter(WIRE)
    for row, layer in enumerate(WIRE.exchange_layers):
        a2f = TransferHeader.decode(bytes(outgoing.row(row).tolist()))
        assert (a2f.direction, a2f.step_id, a2f.layer, a2f.num_tokens) == ("a2f", STEP, layer, 4)
        assert a2f.logits_width == 3
        header = MessageHeader("a2f", STEP, layer, 0, TOKENS, 0, logits_width=3)
        writer.expect(bytes(outgoing.row(row).tolist()), "x", header)
    f2a = bytes(incoming.view[HEADER_BYTES : 2 * HEADER_BYTES])
    assert TransferHeader.decode(f2a).logits_width == 0  # replies carry no logits


def test_a_header_mismatch_names_the_sender_and_both_views():
    writer = HeaderWriter(WIRE)
    sent = bytearray(HEADER_BYTES)
    writer.write(memoryview(sent), 0, MessageHeader("f2a", STEP + 1, 0, 0, 3, 0))
    with pytest.raises(AFDProtocolError) as err:
        expected = MessageHeader("f2a", STEP, 0, 0, 2, 0)
        writer.expect(bytes(sent), "FFN rank 0 (world rank 0)", expected)
    message = str(err.value)
    assert f"step_id: received {STEP + 1}, expected {STEP}" in message
    assert "num_tokens: received 3, expected 2" in message
    assert "[sent by FFN rank 0 (world rank 0)]" in message


def test_a_headered_buffer_keeps_zero_padding_when_headers_are_written_again():
    wire = WireSpec(hidden_size=8, dtype="bfloat16", num_exchange_layers=2, num_experts=4, top_k=2)
    transport, writer = LoopbackTransport(Fabric(), 0, "data"), HeaderWriter(wire)
    buffer = HeaderedBuffer(transport, 256)
    assert not buffer.tensor[:HEADER_BYTES].any()
    buffer.tensor[HEADER_BYTES:].fill_(0xFF)  # bodies after the header change nothing in it
    for step_id, rows in ((7, 5), (8, 0)):
        header = MessageHeader("a2f", step_id, 1, 0, rows, 0, topk=2)
        writer.write(buffer.header, 0, header)
        buffer.publish_header()
        raw = read_header(transport, buffer.tensor)
        assert writer.num_tokens_of(raw) == rows
        writer.expect(raw, "attention rank 0", header)
    assert buffer.nbytes == 256


def test_an_f2a_frame_is_the_header_then_the_rows():
    layout = FrameLayout.of(WIRE, 3)
    assert layout.size == HEADER_BYTES + 3 * 6 * 2
    assert FrameLayout.of(WIRE, 0).size == HEADER_BYTES
