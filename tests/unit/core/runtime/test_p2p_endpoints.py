"""The P2P endpoints and control channel of afd-core over an in-process loopback transport.

Real composed connectors (control sender and inbox threads, endpoints, header rows) on
:mod:`tests.unit.core.loopback` instead of gloo: the protocol's rules without sockets.
On the host data planes the tests' small messages are frames (header and tensors in one
message, :mod:`afd_core.runtime.messages.frames`); the ``message_form`` fixture runs a test a second
time with every message as a header message and bare tensors, the form that messages
above the frame limit take.
"""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from afd_core.connector import WireSpec  # noqa: E402
from afd_core.errors import AFDPeerError, AFDProtocolError, AFDShutdown  # noqa: E402
from afd_core.kit.step_exchanges import StepExchanges  # noqa: E402
from afd_core.runtime.messages import frames  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from tests.unit.core.loopback import DATA_PLANES, close_all, loopback_connectors  # noqa: E402


@pytest.fixture(params=["frames", "header-messages"])
def message_form(request, monkeypatch):
    """Host-plane messages as frames (the tests' sizes), or all above the frame limit."""
    if request.param == "header-messages":
        monkeypatch.setattr(frames, "FRAME_LIMIT_BYTES", 0)
    return request.param


def payload(rank: int, step: int, *counts: int, **flags: bool) -> ControlPayload:
    return ControlPayload(step, rank, tuple(AFDDPMetadata(rank, (n,)) for n in counts), **flags)


def wait_until_ready(ffn, ranks: tuple[int, ...]) -> None:
    """Wait until the FFN rank's inbox threads queued a payload of each of ``ranks``."""
    inbox = ffn.ffn._inbox
    deadline = time.monotonic() + 5
    while inbox.ready_ranks() != ranks:
        assert time.monotonic() < deadline, inbox.ready_ranks()
        time.sleep(0.01)


@pytest.mark.parametrize("data_plane", DATA_PLANES)
def test_an_ffn_rank_computes_its_block_once_and_splits_the_result_back(data_plane, message_form):
    wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=1)
    attention, ffn = loopback_connectors(3, 1, wire, data_plane=data_plane)
    try:
        inputs = [torch.full((n, 4), float(r + 1)) for r, n in enumerate((2, 0, 3))]
        for conn, x in zip(attention, inputs, strict=True):
            conn.attention.begin_step(payload(conn.role_rank, 0, x.shape[0]))
            conn.attention.send(0, 0, x)
        wait_until_ready(ffn[0], (0, 1, 2))
        step = ffn[0].ffn.next_step()
        assert step.attention_ranks == (0, 1, 2)
        batch = ffn[0].ffn.recv(step, 0, 0)
        assert batch.splits == (2, 0, 3)
        assert torch.equal(batch.hidden.cpu(), torch.cat(inputs))
        ffn[0].ffn.send(batch, batch.hidden * 10)
        for conn, x in zip(attention, inputs, strict=True):
            assert torch.equal(conn.attention.recv(0, 0), x * 10)
    finally:
        close_all(attention, ffn)


@pytest.mark.parametrize("data_plane", DATA_PLANES)
def test_router_logits_travel_with_the_hidden_states_and_the_output_is_a_new_tensor(
    data_plane, message_form
):
    wire = WireSpec(
        hidden_size=5,
        dtype="bfloat16",
        num_exchange_layers=1,
        router_logits_width=3,
        router_logits_dtype="float32",
    )
    (attn,), (ffn,) = loopback_connectors(1, 1, wire, gate=True, data_plane=data_plane)
    try:
        hidden = torch.arange(15, dtype=torch.bfloat16).view(3, 5)
        logits = torch.arange(9, dtype=torch.float32).view(3, 3) / 4
        attn.attention.begin_step(payload(0, 0, 3))
        attn.attention.send(0, 0, hidden, router_logits=logits)
        batch = ffn.ffn.recv(ffn.ffn.next_step(), 0, 0)
        assert torch.equal(batch.hidden.cpu(), hidden)
        assert torch.equal(batch.router_logits.cpu(), logits)
        ffn.ffn.send(batch, batch.hidden + 1)
        out = attn.attention.recv(0, 0)
        assert torch.equal(out, hidden + 1)
        assert out.untyped_storage().data_ptr() != hidden.untyped_storage().data_ptr()
    finally:
        close_all([attn], [ffn])


@pytest.mark.parametrize("data_plane", DATA_PLANES)
def test_stages_of_one_step_may_interleave(data_plane, message_form):
    wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=2)
    (attn,), (ffn,) = loopback_connectors(1, 1, wire, data_plane=data_plane)
    try:
        attn.attention.begin_step(payload(0, 0, 2, 3))
        step = None
        for layer in range(2):
            attn.attention.send(layer, 0, torch.full((2, 4), 1.0 + layer))
            attn.attention.send(layer, 1, torch.full((3, 4), 5.0 + layer))
            step = step or ffn.ffn.next_step()
            for stage in (0, 1):
                batch = ffn.ffn.recv(step, layer, stage)
                ffn.ffn.send(batch, -batch.hidden)
            assert torch.equal(attn.attention.recv(layer, 0), torch.full((2, 4), -1.0 - layer))
            assert torch.equal(attn.attention.recv(layer, 1), torch.full((3, 4), -5.0 - layer))
    finally:
        close_all([attn], [ffn])


def test_the_ffn_rank_forms_steps_of_ranks_that_run_the_same_number_of_stages():
    # Each attention rank decides per step whether its batch splits: a rank of one stage
    # waits for the next step rather than break the step of a rank of two.
    wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=1)
    attention, (ffn,) = loopback_connectors(2, 1, wire)
    try:
        attention[0].attention.begin_step(payload(0, 0, 2, 3))
        attention[1].attention.begin_step(payload(1, 0, 4))
        wait_until_ready(ffn, (0, 1))
        two_stages = ffn.ffn.next_step()
        assert two_stages.attention_ranks == (0,) and two_stages.num_stages == 2
        one_stage = ffn.ffn.next_step()
        assert one_stage.attention_ranks == (1,) and one_stage.num_stages == 1
    finally:
        close_all(attention, [ffn])


def test_ranks_of_one_step_may_send_frames_and_header_messages_side_by_side(monkeypatch):
    # hidden 4 x float32: a frame of 2 rows is 96 bytes, of 3 rows 112: only 2 rows fit
    monkeypatch.setattr(frames, "FRAME_LIMIT_BYTES", 100)
    wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=2)
    attention, ffn = loopback_connectors(2, 1, wire, data_plane="exact-sizes")
    try:
        inputs = [torch.full((2, 4), 1.0), torch.arange(12.0).view(3, 4)]
        for conn, x in zip(attention, inputs, strict=True):
            conn.attention.begin_step(payload(conn.role_rank, 0, x.shape[0]))
        wait_until_ready(ffn[0], (0, 1))
        step = ffn[0].ffn.next_step()
        for layer in range(2):
            for conn, x in zip(attention, inputs, strict=True):
                conn.attention.send(layer, 0, x + layer)
            batch = ffn[0].ffn.recv(step, layer, 0)
            assert torch.equal(batch.hidden, torch.cat(inputs) + layer)
            ffn[0].ffn.send(batch, batch.hidden * 2)
            for conn, x in zip(attention, inputs, strict=True):
                assert torch.equal(conn.attention.recv(layer, 0), (x + layer) * 2)
    finally:
        close_all(attention, ffn)


def test_every_reply_is_a_tensor_of_its_own_that_later_replies_leave_alone():
    wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=3)
    (attn,), (ffn,) = loopback_connectors(1, 1, wire)
    try:
        outputs = []
        for step_id in range(2):
            attn.attention.begin_step(payload(0, step_id, 2))
            step = None
            for layer in range(3):
                attn.attention.send(layer, 0, torch.full((2, 4), float(layer)))
                step = step or ffn.ffn.next_step()
                batch = ffn.ffn.recv(step, layer, 0)
                ffn.ffn.send(batch, batch.hidden + step_id)
                outputs.append((step_id, layer, attn.attention.recv(layer, 0)))
        for step_id, layer, out in outputs:
            assert torch.equal(out, torch.full((2, 4), float(layer + step_id)))
    finally:
        close_all([attn], [ffn])


WIRE = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=2)


@pytest.fixture
def pair(message_form):
    (attn,), (ffn,) = loopback_connectors(1, 1, WIRE)
    attn.attention.begin_step(payload(0, 3, 2))
    yield attn, ffn
    close_all([attn], [ffn])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (device headers)")
def test_in_device_memory_a_mispaired_layer_is_found_at_the_end_of_the_step_on_both_sides(
    monkeypatch: pytest.MonkeyPatch,
):
    # NCCL's path: headers are compared on the device once the step's last message is in.
    # Both endpoints run a build that skips the rule of a step's exchanges (any layer, any
    # order), so that the mispaired layer reaches the wire and the header check.
    layers = WIRE.exchange_layers

    def take_any(self: StepExchanges, layer: int, stage: int) -> int:
        return stage * len(layers) + layers.index(layer)

    monkeypatch.setattr(StepExchanges, "take", take_any)
    (attn,), (ffn,) = loopback_connectors(1, 1, WIRE, data_plane="device")
    try:
        attn.attention.begin_step(payload(0, 3, 2))
        attn.attention.send(1, 0, torch.ones(2, 4))  # layer 1 where the FFN expects layer 0
        step = ffn.ffn.next_step()
        ffn.ffn.send(ffn.ffn.recv(step, 0, 0), torch.ones(2, 4, device="cuda"))
        attn.attention.recv(1, 0)
        attn.attention.send(0, 0, torch.ones(2, 4))
        batch = ffn.ffn.recv(step, 1, 0)
        with pytest.raises(
            AFDProtocolError,
            match=r"layer: received 1, expected 0.*\[sent by attention rank 0 \(world rank 1\)\]",
        ):
            ffn.ffn.send(batch, batch.hidden)
        with pytest.raises(AFDProtocolError, match=r"f2a message .*\[sent by FFN rank 0"):
            attn.attention.recv(0, 0)
    finally:
        close_all([attn], [ffn])


def test_tensors_that_differ_from_the_announced_step_are_refused_before_sending(pair):
    attn, _ = pair
    with pytest.raises(AFDProtocolError, match=r"hidden is \(3, 4\).*say a contiguous \(2, 4\)"):
        attn.attention.send(0, 0, torch.zeros(3, 4))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.send(0, 1, torch.zeros(2, 4)), "stage 1 is outside step 3's 1 stage"),
        (lambda e: e.send(5, 0, torch.zeros(2, 4)), r"layer 5 is not an exchange layer"),
        (
            lambda e: e.send(0, 0, torch.zeros(2, 4), router_logits=torch.zeros(2, 1)),
            "router_logits given",
        ),
        (lambda e: e.send(0, 0, torch.zeros(2, 4, dtype=torch.float64)), "torch.float64"),
    ],
)
def test_each_kind_of_bad_send_is_named(pair, call, message):
    attn, _ = pair
    with pytest.raises(AFDProtocolError, match=message):
        call(attn.attention)


def test_a_step_may_not_start_before_the_previous_one_exchanged_every_layer(pair):
    attn, ffn = pair
    attn.attention.send(0, 0, torch.ones(2, 4))
    step = ffn.ffn.next_step()
    ffn.ffn.send(ffn.ffn.recv(step, 0, 0), torch.ones(2, 4))
    attn.attention.recv(0, 0)
    with pytest.raises(AFDProtocolError, match="after 1 of the 2 layer exchanges of step 3"):
        attn.attention.begin_step(payload(0, 4, 2))
    with pytest.raises(AFDProtocolError, match="failed earlier; close it"):
        attn.attention.send(1, 0, torch.ones(2, 4))


def test_send_and_recv_come_in_pairs_per_stage(pair):
    attn, _ = pair
    with pytest.raises(AFDProtocolError, match="but sent nothing for that stage"):
        attn.attention.recv(0, 0)


def test_a_second_send_of_a_stage_before_its_recv_is_refused(pair):
    attn, _ = pair
    attn.attention.send(0, 0, torch.ones(2, 4))
    with pytest.raises(AFDProtocolError, match="awaits recv"):
        attn.attention.send(1, 0, torch.ones(2, 4))


def test_the_result_of_another_layer_is_not_handed_out(pair):
    attn, _ = pair
    attn.attention.send(0, 0, torch.ones(2, 4))
    with pytest.raises(AFDProtocolError, match=r"result of layer 1 stage 0, but sent layer 0"):
        attn.attention.recv(1, 0)


def test_the_attention_rank_refuses_a_layer_out_of_order_naming_both_layers(pair):
    attn, _ = pair
    with pytest.raises(AFDProtocolError, match=r"exchanged layer 1 in stage 0 of step 3 where "
                       r"layer 0 \(exchange 1 of 2\) was expected"):  # fmt: skip
        attn.attention.send(1, 0, torch.ones(2, 4))


def test_the_ffn_rank_refuses_a_layer_out_of_order_and_a_result_it_did_not_receive(pair):
    attn, ffn = pair
    attn.attention.send(0, 0, torch.ones(2, 4))
    step = ffn.ffn.next_step()
    with pytest.raises(AFDProtocolError, match=r"FFN rank 0 exchanged layer 1 .* where layer 0"):
        ffn.ffn.recv(step, 1, 0)


def test_the_ffn_rank_sends_only_the_result_of_the_layer_it_received(pair):
    attn, ffn = pair
    attn.attention.send(0, 0, torch.ones(2, 4))
    batch = ffn.ffn.recv(ffn.ffn.next_step(), 0, 0)
    batch.layer = 1  # as if answering for layer 1
    with pytest.raises(AFDProtocolError, match=r"result of layer 1 stage 0, but received layer 0"):
        ffn.ffn.send(batch, batch.hidden)


def test_an_ffn_output_of_the_wrong_size_is_refused(pair):
    attn, ffn = pair
    attn.attention.send(0, 0, torch.ones(2, 4))
    batch = ffn.ffn.recv(ffn.ffn.next_step(), 0, 0)
    with pytest.raises(AFDProtocolError, match=r"output is \(3, 4\)"):
        ffn.ffn.send(batch, torch.ones(3, 4))


def test_closing_wakes_next_step_and_later_calls_raise_shutdown(pair):
    _, ffn = pair
    ffn.ffn.next_step()  # the announced step
    threading.Timer(0.2, ffn.close).start()
    assert ffn.ffn.next_step() is None
    with pytest.raises(AFDShutdown):
        ffn.ffn.recv(None, 0, 0)


def test_an_attention_rank_that_leaves_is_named_by_the_ffn_rank(pair):
    attn, ffn = pair
    ffn.ffn.next_step()
    attn.close()
    with pytest.raises(
        AFDPeerError, match=r"attention rank 0 \(world rank 1\) closed the connection"
    ):
        ffn.ffn.next_step()


def test_graph_steps_are_refused_by_a_connector_without_replay_guard(pair):
    attn, _ = pair
    attn.close()
    (attn,), (ffn,) = loopback_connectors(1, 1, WIRE)
    try:
        with pytest.raises(AFDProtocolError, match="run the attention role with --enforce-eager"):
            attn.attention.begin_step(payload(0, 0, 2, is_graph_step=True))
    finally:
        close_all([attn], [ffn])
