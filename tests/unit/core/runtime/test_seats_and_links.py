"""Seat records and the FFN rank's links: who may take a seat, what losing a link means.

Pure logic over an in-memory store (the store calls of ``torch.distributed.Store`` that
:mod:`afd_core.runtime.seats` uses); the processes and gloo groups are in
``tests/integration/test_attention_replacement.py``.
"""

from __future__ import annotations

import time

import pytest

from afd_core.errors import AFDPeerError, AFDProtocolError
from afd_core.failures import Fuse, PeerFailures
from afd_core.kit.peer_links import AttentionLink
from afd_core.runtime import links as links_module
from afd_core.runtime import seats
from afd_core.runtime.links import BlockLinks
from afd_core.runtime.rendezvous import Session
from afd_core.topology import Topology


class MemoryStore:
    """``add``, ``check``, ``get``, ``set`` of a TCPStore, in a dict."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def add(self, key: str, amount: int) -> int:
        value = int(self.values.get(key, b"0")) + amount
        self.values[key] = str(value).encode()
        return value

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()


def session() -> Session:
    return Session(MemoryStore(), "s1", "127.0.0.1:1")  # type: ignore[arg-type]


def test_a_claim_succeeds_once_its_generation_was_vacated():
    s = session()
    seats.mark_seated(s, 0, 0)
    assert seats.vacate(s, 0) == 1
    seats.claim_vacated_seat(s, 0, 1, lambda: False)  # returns at once


def test_a_claim_on_a_held_seat_fails_naming_the_rank_and_leaves_a_refusal(monkeypatch):
    monkeypatch.setattr(seats, "VACANCY_WAIT_S", 0.1)
    s = session()
    seats.mark_seated(s, 2, 0)
    with pytest.raises(AFDProtocolError, match="attention rank 2 joined twice: it is serving"):
        seats.claim_vacated_seat(s, 2, 1, lambda: False)
    assert seats.read_answer(s, 2, 1) == "refused: a duplicate of a serving rank"


def test_seat_keys_live_in_the_session_and_links_in_namespaces_of_their_own():
    s = session()
    seats.answer(s, 1, 3, None)
    assert s.store.values["afd/s1/link/attention/1/3"] == b"ready"
    assert s.link(1, 2, 3).key("liveness", 0) == "afd/s1/link/a1/f2/g3/liveness/0"
    assert s.link(1, 2, 3).store is s.store
    assert s.group("ffn").key("control") == "afd/s1/ffn/control"


class RecordingWorld:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def interrupt(self) -> None:
        self.calls.append("interrupt")

    def release(self) -> None:
        self.calls.append("release")


def link(rank: int, world: RecordingWorld | None) -> AttentionLink:
    failures = PeerFailures(Topology(2, 1), 5.0, Fuse("test"), (0, 1 + rank))
    return AttentionLink(rank, 1, None, None, failures, 0, world)  # type: ignore[arg-type]


def test_shared_links_are_never_let_go():
    links = BlockLinks(0, [link(0, None)])
    assert not links.lose(links.get(0), AFDPeerError("gone"))
    assert links.get(0).lost is None
    assert links.idle_error() is None


def test_a_lost_link_is_interrupted_at_once_and_released_and_vacated_at_the_boundary():
    s = session()
    world = RecordingWorld()
    links = BlockLinks(0, [], replaceable=True, session=s, idle_limit_s=60)
    links.add_initial(link(1, world))
    woken: list[bool] = []
    links.on_change(lambda: woken.append(True))
    assert links.lose(links.get(1), AFDPeerError("attention rank 1 is gone"))
    assert world.calls == ["interrupt"] and woken == [True]
    assert links.lose(links.get(1), AFDPeerError("again"))  # once only
    assert world.calls == ["interrupt"]
    ended: list[int] = []
    added, lost = links.settle(lambda gone: ended.append(gone.rank))
    assert (added, [g.rank for g in lost], ended) == ([], [1], [1])
    assert world.calls == ["interrupt", "release"]
    assert not links.holds(1) and seats.vacancies(s, 1) == 1


def test_an_ffn_rank_without_linked_attention_ranks_fails_after_its_idle_limit(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(links_module.time, "monotonic", lambda: clock[0])
    links = BlockLinks(3, [], replaceable=True, session=session(), idle_limit_s=5)
    assert links.idle_error() is None  # the idle time starts now
    clock[0] += 4.9
    assert links.idle_error() is None
    clock[0] += 0.2
    error = links.idle_error()
    assert isinstance(error, AFDPeerError)
    assert "FFN rank 3: no attention rank came within ffn_idle_limit_s=5 s" in str(error)
    links.add(link(0, RecordingWorld()))
    assert links.idle_error() is None  # a linked rank resets it
    assert links.get(0).name == "attention rank 0 (world rank 1)"


def test_a_follower_that_lets_a_link_go_first_waits_for_the_next_generation(monkeypatch):
    """An expert-routed follower may release a departed server's link before FFN rank 0
    vacates the seat: the seat records then still name that server's generation (joined
    once, answered ready), and reopening it would wait on a dead peer. The acceptor opens
    only the next generation, once vacated and claimed."""
    monkeypatch.setattr(links_module, "ACCEPT_POLL_S", 0.01)
    s = session()
    s.store.add(s.key("joined", "attention", 1), 1)  # generation 0 joined
    seats.answer(s, 1, 0, None)
    seats.mark_seated(s, 1, 0)
    links = BlockLinks(1, [], replaceable=True, session=s, idle_limit_s=60, owns_seats=False)
    links.add_initial(link(1, RecordingWorld()))
    opened: list[tuple[int, int]] = []
    failures = links.get(1).failures
    replacement = AttentionLink(1, 1, None, None, failures, 1, RecordingWorld())  # type: ignore[arg-type]

    def open_link_world(rank: int, generation: int) -> AttentionLink:
        opened.append((rank, generation))
        return replacement

    acceptor = links_module.LinkAcceptor(links, s, (1,), open_link_world, timeout_s=5.0)
    acceptor.start()
    try:
        assert links.lose(links.get(1), AFDPeerError("attention rank 1 left"))
        links.settle(lambda gone: None)  # the follower lets go; the seat is not vacated yet
        assert not links.holds(1) and links.latest_generation(1) == 0
        time.sleep(0.2)  # twenty looks at the seat records
        assert opened == []
        assert seats.vacate(s, 1) == 1  # FFN rank 0 lets its link go
        s.store.add(s.key("joined", "attention", 1), 1)  # the replacement joins ...
        seats.answer(s, 1, 1, None)  # ... and is ready
        deadline = time.monotonic() + 5.0
        while not links.holds(1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert opened == [(1, 1)] and links.get(1) is replacement
        assert links.latest_generation(1) == 1
    finally:
        acceptor.stop(5.0)
