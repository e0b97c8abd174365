"""PeerWatch against a real TCPStore: leaving records, and a store whose host dies."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from afd_core.launch import free_ports
from afd_core.peer_watch import PeerWatch, announce_leaving
from afd_core.rendezvous import Session, listening

_HOST_SCRIPT = (
    "import sys, time, datetime, torch.distributed as dist\n"
    "store = dist.TCPStore('127.0.0.1', int(sys.argv[1]), None, True,"
    " datetime.timedelta(seconds=30), wait_for_workers=False)\n"
    "time.sleep(120)\n"
)


class Reports:
    """What a watch reported, and when the first report came."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.first = threading.Event()

    def __call__(self, rank: int, how: str) -> None:
        self.calls.append((rank, how))
        self.first.set()


@pytest.fixture
def hosted_session() -> Iterator[tuple[Session, subprocess.Popen[bytes]]]:
    """A session on a store hosted by a child process (kill it to lose the store)."""
    (port,) = free_ports(1)
    host = subprocess.Popen([sys.executable, "-c", _HOST_SCRIPT, str(port)])
    try:
        deadline = time.monotonic() + 30
        while not listening("127.0.0.1", port):
            assert host.poll() is None and time.monotonic() < deadline, "store did not start"
            time.sleep(0.05)
        client = dist.TCPStore(
            "127.0.0.1", port, None, False, timedelta(seconds=10), wait_for_workers=False
        )
        yield Session(client, "s1", "127.0.0.1", port), host
    finally:
        host.kill()
        host.wait(10)


def test_a_leaving_record_of_a_peer_is_reported_once(hosted_session):
    session, _host = hosted_session
    reports = Reports()
    watch = PeerWatch(session, (2, 3), reports, poll_s=0.1)
    watch.start()
    announce_leaving(session, 3, "closed")
    assert reports.first.wait(5)
    time.sleep(0.5)
    watch.stop()
    assert reports.calls == [(3, "it left: closed")]


def test_records_of_other_sessions_and_ranks_are_ignored(hosted_session):
    session, _host = hosted_session
    reports = Reports()
    watch = PeerWatch(session, (2,), reports, poll_s=0.1)
    watch.start()
    announce_leaving(session, 1, "not a peer")
    announce_leaving(Session(session.store, "old", session.host, session.port), 2, "old")
    time.sleep(1.0)
    watch.stop()
    assert reports.calls == []


@pytest.mark.parametrize("host_is_peer", [True, False])
def test_a_dead_store_host_is_reported_only_to_its_peers(hosted_session, host_is_peer):
    session, host = hosted_session
    reports = Reports()
    watch = PeerWatch(session, (0,) if host_is_peer else (1,), reports, poll_s=0.1)
    watch.start()
    time.sleep(0.3)  # connected and polling
    host.kill()
    host.wait(10)
    # A peer hears of it within a few polls; 3 s is ample either way.
    reported = reports.first.wait(3)
    watch.stop()
    if host_is_peer:
        assert reported
        (rank, how), *rest = reports.calls
        assert rank == 0 and not rest
        assert f"its rendezvous store at {session.address}" in how
    else:
        assert not reported


def test_a_stopped_watch_reports_nothing(hosted_session):
    session, _host = hosted_session
    reports = Reports()
    watch = PeerWatch(session, (1,), reports, poll_s=0.1)
    watch.start()
    watch.stop()
    announce_leaving(session, 1, "after stop")
    time.sleep(0.5)
    assert reports.calls == []
