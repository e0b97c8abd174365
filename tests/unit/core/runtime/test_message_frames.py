"""Frame layouts and buffers of :mod:`afd_core.runtime.messages.frames` (pure torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import WireSpec  # noqa: E402
from afd_core.runtime.messages import frames  # noqa: E402
from afd_core.runtime.messages.frames import FrameBuffer, FrameLayout, ReplyFrames, uses_frames  # noqa: E402

#: An odd hidden size in a 2-byte dtype: the hidden bytes are not a multiple of 64.
ODD = WireSpec(
    hidden_size=5,
    dtype="bfloat16",
    num_exchange_layers=2,
    router_logits_width=3,
    router_logits_dtype="float32",
)


def test_every_part_of_a_frame_starts_on_a_64_byte_boundary():
    layout = FrameLayout.of(ODD, 3)
    assert layout.hidden_bytes == 3 * 5 * 2
    assert layout.logits_at == 64 + 64  # 30 hidden bytes rounded up to 64
    assert layout.size == 64 + 30
    assert layout.size_with_logits == 128 + 3 * 3 * 4


def test_a_frame_without_logits_or_rows_is_the_header_alone():
    layout = FrameLayout.of(WireSpec(hidden_size=8, dtype="float32", num_exchange_layers=1), 0)
    assert layout.size == layout.size_with_logits == 64


class _Transport:
    def __init__(self, device: str) -> None:
        self.device = torch.device(device)


def test_only_host_transports_send_frames_and_only_up_to_the_limit(monkeypatch):
    layout = FrameLayout.of(ODD, 3)
    assert uses_frames(_Transport("cpu"), layout)
    assert not uses_frames(_Transport("meta"), layout)
    monkeypatch.setattr(frames, "FRAME_LIMIT_BYTES", layout.size_with_logits - 1)
    assert not uses_frames(_Transport("cpu"), layout)


def test_parts_written_into_a_frame_read_back_as_views():
    held = FrameBuffer().hold(FrameLayout.of(ODD, 3))
    hidden = torch.arange(15, dtype=torch.bfloat16).view(3, 5)
    logits = torch.arange(9, dtype=torch.float32).view(3, 3)
    held.write_hidden(hidden)
    held.write_logits(logits.t().contiguous().t())  # not contiguous: copied through a view
    assert torch.equal(held.hidden(5, torch.bfloat16), hidden)
    assert torch.equal(held.logits(3, torch.float32), logits)
    assert held.message.numel() == 64 + 30
    assert held.message_with_logits.numel() == 128 + 36


def test_a_buffer_grows_for_a_larger_frame_and_keeps_its_size_for_smaller_ones():
    buffer = FrameBuffer()
    big = buffer.hold(FrameLayout.of(ODD, 8))
    small = buffer.hold(FrameLayout.of(ODD, 2))
    assert small.address == big.address
    assert buffer.hold(FrameLayout.of(ODD, 9)).address != big.address


def test_reply_frames_give_each_layer_a_frame_and_output_of_its_own():
    layout = FrameLayout.of(ODD, 2)
    replies = ReplyFrames(layout, 5, torch.bfloat16)
    replies.prepare()
    taken = []
    for _ in range(3):
        taken.append(replies.take())
        replies.prepare()  # what the endpoint does once a layer's messages are posted
    for i, (message, address, out) in enumerate(taken):
        assert message.numel() == layout.size
        assert message.data_ptr() == address
        assert out.shape == (2, 5) and out.dtype == torch.bfloat16 and out.is_contiguous()
        assert out.data_ptr() == address + 64
        message[64:].view(torch.bfloat16).fill_(i)
    for i, (_, _, out) in enumerate(taken):  # no frame overlaps another
        assert torch.equal(out, torch.full((2, 5), float(i), dtype=torch.bfloat16))


def test_a_reply_frame_is_allocated_when_none_was_prepared():
    replies = ReplyFrames(FrameLayout.of(ODD, 1), 5, torch.bfloat16)
    first, second = replies.take(), replies.take()
    assert first[1] != second[1]
