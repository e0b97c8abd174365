"""P2pProtocolConnector over an in-process loopback transport (uses torch, no sockets).

The loopback delivers each posted send to the matching receive (same source,
destination and tag, in order) and, like gloo, refuses a message larger than the
receive buffer.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from afd_core.config import AFDConfig  # noqa: E402
from afd_core.connector import WireSpec  # noqa: E402
from afd_core.connectors.p2p_protocol import P2pProtocolConnector  # noqa: E402
from afd_core.connectors.p2p_wire import a2f_header  # noqa: E402
from afd_core.errors import AFDConfigError, AFDProtocolError, AFDShutdown  # noqa: E402
from afd_core.metadata import AFDDPMetadata, ControlPayload  # noqa: E402


class Fabric:
    """Messages in flight between the loopback connectors of one test."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[tuple[int, int, int], deque[bytes]] = defaultdict(deque)
        self.closed = False


class Loopback(P2pProtocolConnector):
    name = "Loopback"

    def __init__(self, fabric: Fabric, *args: Any) -> None:
        super().__init__(*args)
        self.fabric = fabric

    def _initialize(self) -> None:
        self._start_protocol()

    def _close(self) -> None:
        with self.fabric.cond:
            self.fabric.closed = True
            self.fabric.cond.notify_all()
        self._stop_protocol()

    def _post_send(self, buf, peer, tag):
        with self.fabric.cond:
            self.fabric.queues[self.world_rank, peer, tag].append(bytes(buf.numpy()))
            self.fabric.cond.notify_all()

    def _post_recv(self, buf, peer, tag):
        return buf, (peer, self.world_rank, tag)

    def _wait(self, handle, peer, deadline, what):
        if handle is None:  # a send: delivered at once
            return
        buf, key = handle
        with self.fabric.cond:
            while not self.fabric.queues[key]:
                if self.fabric.closed:
                    raise self._peer_failure(peer, what, "loopback closed", False)
                self.fabric.cond.wait(0.1)
            data = self.fabric.queues[key].popleft()
        assert len(data) <= buf.numel(), "gloo would abort this process"
        buf[: len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def world(a: int, f: int, wire: WireSpec) -> tuple[list[Loopback], list[Loopback]]:
    fabric = Fabric()

    def make(role: str, rank: int) -> Loopback:
        cfg = AFDConfig(
            role=role,
            connector="Loopback",
            num_attention_ranks=a,
            num_ffn_ranks=f,
            afd_process_group_timeout_s=5,
        )
        conn = Loopback(fabric, cfg, rank, wire)
        conn.initialize()
        return conn

    return [make("attention", r) for r in range(a)], [make("ffn", r) for r in range(f)]


def close_all(*groups: list[Loopback]) -> None:
    for group in groups:
        for conn in group:
            conn.close()


def send(conn: Loopback, step: int, layer: int, hidden, logits=None, stage: int = 0):
    header = a2f_header(step, layer, stage, hidden.shape[0], conn.role_rank, conn.wire)
    conn.send_hidden(header, hidden, logits)
    return header


def test_an_ffn_rank_computes_its_block_once_and_splits_the_result_back():
    wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=1)
    attention, ffn = world(3, 1, wire)
    try:
        inputs = [torch.full((n, 4), float(r + 1)) for r, n in enumerate((2, 0, 3))]
        for conn, x in zip(attention, inputs, strict=True):
            conn.control_plane.send_step(
                ControlPayload(0, conn.role_rank, (AFDDPMetadata(conn.role_rank, (x.shape[0],)),))
            )
        headers = [send(conn, 0, 0, x) for conn, x in zip(attention, inputs, strict=True)]
        deadline = time.monotonic() + 5
        while ffn[0]._inbox.ready_ranks() != (0, 1, 2):  # receiver threads queue payloads
            assert time.monotonic() < deadline
            time.sleep(0.01)
        step = ffn[0].control_plane.recv_step()
        assert step.attention_ranks == (0, 1, 2)
        batch = ffn[0].recv_hidden(step, 0, 0)
        assert batch.splits == (2, 0, 3)
        assert torch.equal(batch.hidden, torch.cat(inputs))
        assert [h.sender_rank for h in batch.headers] == [0, 1, 2]
        ffn[0].send_output(batch, batch.hidden * 10)
        for conn, header, x in zip(attention, headers, inputs, strict=True):
            out = conn.recv_output(header, torch.empty_like(x))
            assert torch.equal(out, x * 10)
    finally:
        close_all(attention, ffn)


def test_router_logits_that_are_not_aligned_for_their_dtype_still_arrive_intact():
    # 3 tokens x 5 columns of bf16 = 30 bytes: the float32 logits start unaligned.
    wire = WireSpec(
        hidden_size=5,
        dtype="bfloat16",
        num_exchange_layers=1,
        router_logits_width=3,
        router_logits_dtype="float32",
    )
    (attn,), (ffn,) = world(1, 1, wire)
    try:
        hidden = torch.arange(15, dtype=torch.bfloat16).view(3, 5)
        logits = torch.arange(9, dtype=torch.float32).view(3, 3) / 4
        attn.control_plane.send_step(ControlPayload(0, 0, (AFDDPMetadata(0, (3,)),)))
        header = send(attn, 0, 0, hidden, logits)
        batch = ffn.recv_hidden(ffn.control_plane.recv_step(), 0, 0)
        assert torch.equal(batch.hidden, hidden)
        assert torch.equal(batch.router_logits, logits)
        ffn.send_output(batch, batch.hidden + 1)
        assert torch.equal(attn.recv_output(header, torch.empty_like(hidden)), hidden + 1)
    finally:
        close_all([attn], [ffn])


WIRE = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=2)


@pytest.fixture
def pair():
    (attn,), (ffn,) = world(1, 1, WIRE)
    attn.control_plane.send_step(ControlPayload(3, 0, (AFDDPMetadata(0, (2,)),)))
    yield attn, ffn
    close_all([attn], [ffn])


def test_a_header_that_differs_from_the_announced_step_is_refused_before_sending(pair):
    attn, _ = pair
    with pytest.raises(AFDProtocolError, match=r"num_tokens=3 \(expected 2\)"):
        attn.send_hidden(a2f_header(3, 0, 0, 3, 0, WIRE), torch.zeros(3, 4))
    with pytest.raises(AFDProtocolError, match="exchanges step 4 but announced step 3"):
        attn.send_hidden(a2f_header(4, 0, 0, 2, 0, WIRE), torch.zeros(2, 4))
    with pytest.raises(AFDProtocolError, match=r"hidden is \(2, 5\)"):
        attn.send_hidden(a2f_header(3, 0, 0, 2, 0, WIRE), torch.zeros(2, 5))
    with pytest.raises(AFDProtocolError, match="router_logits given"):
        attn.send_hidden(a2f_header(3, 0, 0, 2, 0, WIRE), torch.zeros(2, 4), torch.zeros(2, 1))


def test_a_step_may_not_start_before_the_previous_one_exchanged_every_layer(pair):
    attn, ffn = pair
    header = send(attn, 3, 0, torch.ones(2, 4))
    ffn.send_output(ffn.recv_hidden(ffn.control_plane.recv_step(), 0, 0), torch.ones(2, 4))
    attn.recv_output(header, torch.empty(2, 4))
    with pytest.raises(AFDProtocolError, match="after 1 layer exchanges in step 3, expected 2"):
        attn.control_plane.send_step(ControlPayload(4, 0, (AFDDPMetadata(0, (2,)),)))
    with pytest.raises(AFDProtocolError, match="failed earlier; close it"):
        attn.send_hidden(header, torch.ones(2, 4))


def test_send_hidden_and_recv_output_come_in_pairs_per_stage(pair):
    attn, _ = pair
    with pytest.raises(AFDProtocolError, match="but sent nothing for that stage"):
        attn.recv_output(a2f_header(3, 0, 0, 2, 0, WIRE), torch.empty(2, 4))
    send(attn, 3, 0, torch.ones(2, 4))
    with pytest.raises(AFDProtocolError, match="awaits recv_output"):
        send(attn, 3, 1, torch.ones(2, 4))
    with pytest.raises(AFDProtocolError, match=r"result of layer 1 .* but sent layer 0 of step 3"):
        attn.recv_output(a2f_header(3, 1, 0, 2, 0, WIRE), torch.empty(2, 4))


def test_the_ffn_rank_names_both_views_of_a_mispaired_layer(pair):
    attn, ffn = pair
    send(attn, 3, 1, torch.ones(2, 4))  # layer 1 where FFN expects layer 0
    step = ffn.control_plane.recv_step()
    with pytest.raises(
        AFDProtocolError,
        match=r"layer: received 1, expected 0.*\[sent by "
        r"attention rank 0 \(world rank 1\)\]",
    ):
        ffn.recv_hidden(step, 0, 0)


def test_an_ffn_output_of_the_wrong_size_is_refused(pair):
    attn, ffn = pair
    send(attn, 3, 0, torch.ones(2, 4))
    batch = ffn.recv_hidden(ffn.control_plane.recv_step(), 0, 0)
    with pytest.raises(AFDProtocolError, match=r"output is \(3, 4\)"):
        ffn.send_output(batch, torch.ones(3, 4))


def test_closing_wakes_recv_step_and_later_calls_raise_shutdown(pair):
    _, ffn = pair
    ffn.control_plane.recv_step()  # the announced step
    threading.Timer(0.2, ffn.close).start()
    assert ffn.control_plane.recv_step() is None
    with pytest.raises(AFDShutdown):
        ffn.send_output(None, None)


def test_a_wire_dtype_that_cannot_travel_is_a_config_error():
    with pytest.raises(AFDConfigError, match="float64"):
        world(1, 1, WireSpec(4, "float64", 1))
