"""How a rank explains a failed transfer: which peer, what it waited for, the root cause."""

from __future__ import annotations

import threading

from afd_core import failures as failures_module
from afd_core.dataplane.transport import TransferFailed
from afd_core.errors import AFDPeerError
from afd_core.failures import Fuse, PeerFailures
from afd_core.kit.pairing import ALL_TO_ALL
from afd_core.topology import Topology


def explain(fuse: Fuse, reason: str) -> str:
    # World ranks: FFN 0, FFN 1, attention 0.
    failures = PeerFailures(Topology(1, 2, ALL_TO_ALL), 30.0, fuse)
    return str(failures.error(TransferFailed(0, reason, "pair closed"), "layer 2 of step 0"))


def test_a_peer_that_closed_is_named_when_nothing_else_failed(monkeypatch):
    monkeypatch.setattr(failures_module, "ROOT_CAUSE_GRACE_S", 0.01)
    message = explain(Fuse("attention"), "peer_closed")
    assert message.startswith("AFD: FFN rank 0 (world rank 0) closed the connection during ")
    assert "layer 2 of step 0" in message and "[pair closed]" in message


def test_a_crash_reported_during_the_grace_is_named_instead_of_the_peer_that_closed(
    monkeypatch,
):
    """FFN rank 1 is killed; FFN rank 0 fails because of it and closes. The attention
    rank's wait on FFN rank 0 ends first; its peer watch reports FFN rank 1 a moment later.
    (A long grace: the wait ends when the report comes, however late the timer fires.)"""
    monkeypatch.setattr(failures_module, "ROOT_CAUSE_GRACE_S", 30.0)
    fuse = Fuse("attention")
    crash = AFDPeerError("AFD: FFN rank 1 (world rank 1) is gone: its process ended")
    threading.Timer(0.05, fuse.blow, (crash,)).start()
    message = explain(fuse, "peer_closed")
    assert message == f"{crash} (while waiting for layer 2 of step 0)"


def test_an_interrupted_wait_names_the_failure_that_interrupted_it():
    fuse = Fuse("attention")
    fuse.blow(AFDPeerError("AFD: FFN rank 1 (world rank 1) is gone: its process ended"))
    assert explain(fuse, "interrupted") == (
        "AFD: FFN rank 1 (world rank 1) is gone: its process ended "
        "(while waiting for layer 2 of step 0)"
    )
