"""Two stages per step on a data plane with NCCL's pairing rule: no deadlock.

NCCL runs a pair's sends and receives on one stream in posting order. The attention
stages call ``send(L,0) send(L,1) recv(L,0) send(L+1,0) recv(L,1) ...`` (the stage
scheduler's turns), but the P2P endpoints post each reply's receive inside ``send``, so
the pair's order is ``S(L,0) R(L,0) S(L,1) R(L,1)`` against the FFN rank's layer-major
``R(L,0) S(L,0) R(L,1) S(L,1)``: they match. These tests run the real attention
endpoint under the real :class:`StageScheduler` against the real FFN endpoint serving
layer-major on its own thread, over ``InOrderLoopbackTransport`` (which deadlocks where
NCCL would), for 1 to 4 layers and both message forms, P2P 1A1F and expert-routed 1A2F
(every attention rank exchanges with every FFN rank); and plant the order that does
deadlock (an FFN rank that serves stage 1 first) to show it ends in a bounded error.
"""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from afd_attention.stage_scheduler import StageScheduler  # noqa: E402
from afd_core.connector import ExpertRouting, WireSpec  # noqa: E402
from afd_core.errors import AFDError, AFDPeerError, AFDProtocolError  # noqa: E402
from afd_core.runtime.messages import frames  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from tests.unit.core.loopback import close_all, loopback_connectors  # noqa: E402

HIDDEN = 8
#: Tokens of stage 0 and stage 1.
TOKENS = (3, 5)
#: Expert-routed: experts, top-k; stage s routes its tokens to experts ``ROUTES[s]``
#: (one on each FFN rank of two), weights 0.5 each.
EXPERTS, TOP_K = 4, 2
ROUTES = ((0, 3), (1, 2))


@pytest.fixture(params=["frames", "header-messages"])
def message_form(request, monkeypatch):
    if request.param == "header-messages":
        monkeypatch.setattr(frames, "FRAME_LIMIT_BYTES", 0)
    return request.param


def _serve(ffn, layers: int, stage_order: tuple[int, ...], errors: list[BaseException]) -> None:
    """An FFN rank: one step, layer-major, its stages in ``stage_order``. P2P: the result
    is ``-x * (layer + 2)``; expert-routed: each routed row's expert ``e`` (global id)
    multiplies by ``-(e + 1) * (layer + 2)``, weighted."""
    try:
        step = ffn.next_step()
        for layer in range(layers):
            for stage in stage_order:
                batch = ffn.recv(step, layer, stage)
                out = -batch.hidden * (layer + 2)
                if batch.routing is not None:
                    ids, weights = batch.routing.topk_ids, batch.routing.topk_weights
                    start = ffn.block.start
                    out = sum(
                        out * weights[:, j : j + 1] * (ids[:, j : j + 1] + start + 1)
                        for j in range(TOP_K)
                    )
                ffn.send(batch, out)
    except BaseException as exc:
        errors.append(exc)


def _expected(stage: int, x: torch.Tensor, layers: int, exchange: str) -> torch.Tensor:
    for layer in range(layers):
        x = -x * (layer + 2)
        if exchange == "expert":
            x = x * sum(0.5 * (e + 1) for e in ROUTES[stage])
    return x


def _run(layers: int, stage_order: tuple[int, ...], exchange: str = "block", timeout_s: int = 5):
    expert = exchange == "expert"
    wire = WireSpec(
        hidden_size=HIDDEN,
        dtype="float32",
        num_exchange_layers=layers,
        router_logits_width=EXPERTS if expert else 0,
        num_experts=EXPERTS if expert else 0,
        top_k=TOP_K if expert else 0,
    )
    (attn,), ffns = loopback_connectors(
        1, 2 if expert else 1, wire, timeout_s=timeout_s, exchange=exchange, data_plane="in-order"
    )
    scheduler = StageScheduler(timeout_s=timeout_s)
    errors: list[BaseException] = []
    servers = [
        threading.Thread(target=_serve, args=(f.ffn, layers, stage_order, errors), daemon=True)
        for f in ffns
    ]
    endpoint = attn.attention
    inputs = [torch.full((n, HIDDEN), float(s + 1)) for s, n in enumerate(TOKENS)]

    def routing(s: int) -> ExpertRouting | None:
        if not expert:
            return None
        ids = torch.tensor([ROUTES[s]] * TOKENS[s], dtype=torch.int32)
        return ExpertRouting(ids, torch.full((TOKENS[s], TOP_K), 0.5))

    def stage(s: int):
        def forward() -> torch.Tensor:
            x = inputs[s]
            for layer in range(layers):
                endpoint.send(layer, s, x, routing=routing(s))
                scheduler.checkpoint()
                x = endpoint.recv(layer, s)
            return x

        return forward

    try:
        endpoint.begin_step(ControlPayload(0, 0, tuple(AFDDPMetadata(0, (n,)) for n in TOKENS)))
        for server in servers:
            server.start()
        began = time.monotonic()
        try:
            results = scheduler.run_step([stage(0), stage(1)])
        except AFDError as exc:
            results = exc
        elapsed = time.monotonic() - began
        for server in servers:
            server.join(3 * timeout_s)
            assert not server.is_alive(), "an FFN rank hung"
        return results, errors, elapsed, inputs
    finally:
        scheduler.close()
        close_all([attn], ffns)


@pytest.mark.parametrize("exchange", ["block", "expert"])
@pytest.mark.parametrize("layers", [1, 2, 4])
def test_two_stages_complete_on_one_in_order_stream_per_pair(layers, exchange, message_form):
    results, errors, _, inputs = _run(layers, stage_order=(0, 1), exchange=exchange)
    assert errors == []
    assert not isinstance(results, BaseException), results
    for s, out in enumerate(results):
        assert torch.equal(out, _expected(s, inputs[s], layers, exchange))


@pytest.mark.parametrize("exchange", ["block", "expert"])
def test_an_ffn_rank_that_serves_stage_1_first_deadlocks_into_a_bounded_error(exchange):
    # An order NCCL cannot pair: the attention rank's stream holds S(0,0) R(0,0) S(0,1),
    # while the FFN rank's first op is the receive of stage 1's message. P2P: its size
    # differs, so neither completes and both sides time out; expert-routed: the header
    # messages have one size, so the FFN rank reads stage 0's header and refuses it.
    # Either way both sides fail within their bounds (the attention rank's stage 0
    # waiting for its reply, or stage 1 for its turn: whichever bound ends first).
    results, errors, elapsed, _ = _run(2, stage_order=(1, 0), exchange=exchange, timeout_s=2)
    assert isinstance(results, AFDError), results
    assert errors, "the FFN rank did not fail"
    expected = AFDPeerError if exchange == "block" else AFDProtocolError
    assert isinstance(errors[0], expected), errors
    assert elapsed < 20
