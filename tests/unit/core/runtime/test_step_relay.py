"""FollowingRelay: which link serves each rank of a forwarded step, by seat generation.

In-process loopback transports (tests/unit/core/loopback.py) carry the step messages from
a stand-in leader; the follower's links are real ``BlockLinks`` of loopback worlds. A
step message's entry for generation *g* of a rank is served on the follower's link of
generation *g*; with a later generation linked, the rank is absent (None); with an
earlier one, the follower waits for the acceptor to link *g*, and fails naming the rank
and generation when it never comes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from afd_core.config import AFDConfig  # noqa: E402
from afd_core.errors import AFDPeerError  # noqa: E402
from afd_core.failures import Fuse, PeerFailures  # noqa: E402
from afd_core.kit.peer_links import AttentionLink  # noqa: E402
from afd_core.runtime.control.relay import FollowingRelay  # noqa: E402
from afd_core.runtime.links import BlockLinks  # noqa: E402
from afd_core.runtime.world import World  # noqa: E402
from afd_core.wire import encode_step_message  # noqa: E402
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload  # noqa: E402
from tests.unit.core.loopback import Fabric, LoopbackTransport  # noqa: E402

TIMEOUT_S = 1.0
NUM_ATTENTION = 2


class Follower:
    """FFN rank 1 of a 2A2F world: its links (generation 0 of both attention ranks) and
    relay, and the stand-in leader's end of the relay transport."""

    def __init__(self) -> None:
        config = AFDConfig(
            role="ffn", connector="ExpertRoutedAFDConnector", num_attention_ranks=NUM_ATTENTION,
            num_ffn_ranks=2, compute_gate_on_attention=True, expert_placement="balanced",
        )  # fmt: skip
        self.fuse = Fuse("test")
        self.failures = PeerFailures(config.topology, TIMEOUT_S, self.fuse)
        fabric = Fabric()
        self.leader = LoopbackTransport(fabric, 0, "control")
        self.links = BlockLinks(
            1, [self.link(a, 0) for a in range(NUM_ATTENTION)], replaceable=True,
            session=object(), idle_limit_s=60, owns_seats=False,  # type: ignore[arg-type]
        )  # fmt: skip
        self.relay = FollowingRelay(
            self.links, LoopbackTransport(fabric, 1, "control"), NUM_ATTENTION, TIMEOUT_S,
            self.fuse, self.failures, "test-relay",
        )  # fmt: skip
        self.relay.start()

    def link(self, rank: int, generation: int) -> AttentionLink:
        """A link of its own (a loopback world) to ``rank``, seat ``generation``."""
        fabric = Fabric()
        control, data = LoopbackTransport(fabric, 0, "c"), LoopbackTransport(fabric, 0, "d")
        world = World(control, data, self.failures, TIMEOUT_S)
        return AttentionLink(rank, 1, control, data, self.failures, generation, world)

    def forward(self, step_id: int, *entries: tuple[int, int]) -> None:
        """The leader forwards a step of ``(attention rank, generation)`` entries."""
        payloads = tuple(ControlPayload(step_id, a, (AFDDPMetadata(a, (2,)),)) for a, _ in entries)
        message = encode_step_message(payloads, tuple(g for _, g in entries), NUM_ATTENTION)
        self.leader.post_send(torch.frombuffer(bytearray(message), dtype=torch.uint8), 1)

    def close(self) -> None:
        self.fuse.close()
        self.leader.close()
        self.relay.stop(2.0)
        self.links.close()


@pytest.fixture
def follower() -> Any:
    f = Follower()
    yield f
    f.close()


def test_entries_of_the_linked_generation_are_served_on_that_link(follower):
    follower.forward(7, (0, 0), (1, 0))
    relayed = follower.relay.next_step()
    assert relayed.step.attention_ranks == (0, 1)
    assert relayed.links == (follower.links.get(0), follower.links.get(1))


def test_a_server_that_left_is_absent_once_its_successor_is_linked(follower):
    old = follower.links.get(1)
    assert follower.links.lose(old, AFDPeerError("attention rank 1 left"))
    follower.links.add(follower.link(1, 1))
    follower.forward(3, (0, 0), (1, 0))  # formed by the leader before it saw rank 1 go
    relayed = follower.relay.next_step()
    assert relayed.links[0] is follower.links.get(0)
    assert relayed.links[1] is None
    # The successor's first step: its step ids start afresh, on its own link.
    follower.forward(0, (1, 1))
    relayed = follower.relay.next_step()
    assert relayed.step.attention_ranks == (1,)
    assert relayed.links == (follower.links.get(1),)
    assert relayed.links[0].generation == 1


def test_a_step_of_a_successor_not_linked_yet_waits_for_its_link(follower):
    old = follower.links.get(1)
    follower.forward(0, (1, 1))

    def acceptor() -> None:
        time.sleep(0.2)
        follower.links.lose(old, AFDPeerError("attention rank 1 left"))
        follower.links.add(follower.link(1, 1))

    thread = threading.Thread(target=acceptor)
    thread.start()
    relayed = follower.relay.next_step()
    thread.join()
    assert relayed.links[0] is not old and relayed.links[0].generation == 1


def test_a_successor_whose_link_never_opens_fails_the_follower_naming_it(follower):
    follower.forward(0, (1, 2))
    started = time.monotonic()
    with pytest.raises(AFDPeerError, match="generation 2 of attention rank 1"):
        follower.relay.next_step()
    assert time.monotonic() - started < TIMEOUT_S + 10.0  # bounded: no hang, any host
