"""``GlooPeerTransport``: the gloo transport bound to one peer, on a real two-rank gloo group.

Both ranks live in this process (one thread each, a ``HashStore`` between them): the
peer transport must pair with the transport's own posts (same tags per direction), bound every
wait on its own, and refuse posts once the transport is interrupted.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")

from afd_core.dataplane.transport import PeerTransport, TransferFailed  # noqa: E402
from afd_core.runtime.gloo import GlooPeerTransport, GlooTransport  # noqa: E402


@pytest.fixture
def transports():
    """Gloo transports of world ranks 0 and 1, joined through one in-memory store."""
    import torch.distributed as dist

    store = dist.HashStore()
    with ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(lambda rank: GlooTransport.open(store, rank, 2, 30.0), (0, 1)))
    yield pair
    for transport in pair:
        transport.close()


def test_the_gloo_transport_gives_a_gloo_lane_to_the_peer(transports):
    to_peer = transports[0].to_peer(1, 5.0)
    assert isinstance(to_peer, GlooPeerTransport) and isinstance(to_peer, PeerTransport)
    assert (to_peer.peer, to_peer.timeout_s) == (1, 5.0)


@pytest.mark.parametrize("poster_side", [0, 1])
def test_a_lane_pairs_with_the_transport_posts_in_both_directions(transports, poster_side):
    to_peer = transports[poster_side].to_peer(1 - poster_side, 10.0)
    other = transports[1 - poster_side]
    ping, pong = torch.arange(8, dtype=torch.int32), torch.arange(8, 16, dtype=torch.int32)
    got_ping, got_pong = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)

    def other_side() -> None:
        other.wait(other.post_recv(got_ping, poster_side), time.monotonic() + 10)
        other.wait(other.post_send(pong, poster_side), time.monotonic() + 10)

    thread = threading.Thread(target=other_side)
    thread.start()
    to_peer.wait_all([to_peer.post_recv(got_pong), to_peer.post_send(ping)])
    thread.join(10)
    assert torch.equal(got_ping, ping) and torch.equal(got_pong, pong)


def test_a_lane_wait_without_deadline_ends_after_the_lane_timeout(transports):
    to_peer = transports[0].to_peer(1, 0.3)
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        to_peer.wait_all([to_peer.post_recv(torch.zeros(4))])
    assert failed.value.reason == "timeout" and failed.value.peer == 1
    assert 0.2 < time.monotonic() - started < 10


def test_a_lane_wait_with_a_deadline_ends_at_the_deadline(transports):
    to_peer = transports[0].to_peer(1, 60.0)
    started = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        to_peer.wait_all([to_peer.post_recv(torch.zeros(4))], time.monotonic() + 0.3)
    assert failed.value.reason == "timeout"
    assert time.monotonic() - started < 10


def test_a_lane_of_an_interrupted_transport_refuses_to_post(transports):
    to_peer = transports[0].to_peer(1, 5.0)
    transports[0].interrupt()
    for post in (to_peer.post_send, to_peer.post_recv):
        with pytest.raises(TransferFailed) as failed:
            post(torch.zeros(4))
        assert failed.value.reason == "interrupted"


def test_a_lane_of_a_closed_transport_can_be_made_and_refuses_to_post(transports):
    transports[0].close()
    to_peer = transports[0].to_peer(1, 5.0)  # as the FFN rank makes one for a lost link's plan
    with pytest.raises(TransferFailed) as failed:
        to_peer.post_recv(torch.zeros(4))
    assert failed.value.reason == "interrupted"
