"""Learn within about a second that a peer rank left, whatever the transport notices.

Transports report a dead peer late or never: an NCCL operation with a vanished peer
waits for its timeout, and gloo can miss a connection that closes just as a send is
posted (seen in CI: that send then waited its whole ``afd_process_group_timeout_s``).
The rendezvous store is a second, transport-independent line to every rank:

* a rank that closes its connector writes ``afd/<session>/left/<world rank>`` with the
  reason (:func:`announce_leaving`; best effort);
* every rank runs a :class:`PeerWatch` thread that polls, over its own store
  connection, for those records of its peers, and notices when the store itself stops
  answering, which means FFN rank 0 (its host) is gone.

A loss seen on :data:`CONFIRM_POLLS` consecutive polls is reported once through
``on_lost``; the delay lets data a leaving peer sent just before it left arrive first.
Only peers count: a silent store matters to the ranks FFN rank 0 exchanges data with.
A rank killed outright (no record) that is not FFN rank 0 is still found only by the
transport.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from afd_core.rendezvous import Session, listening

if TYPE_CHECKING:
    from torch.distributed import Store

logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds between two polls of the store.
POLL_S = 0.5
#: Consecutive polls that must see a loss before it is reported.
CONFIRM_POLLS = 2
#: Seconds one store operation of the watch may take.
STORE_TIMEOUT_S = 5.0
#: World rank of the store's host (FFN rank 0).
STORE_HOST_RANK = 0


def announce_leaving(session: Session, world_rank: int, reason: str) -> None:
    """Record that ``world_rank`` leaves the session (best effort: errors are ignored)."""
    try:
        session.store.set(session.key("left", world_rank), reason)
    except RuntimeError as exc:  # the store's host is gone already: peers see that
        logger.debug("AFD: could not record that world rank %d leaves: %s", world_rank, exc)


class PeerWatch:
    """A daemon thread that reports the first peer that left the session.

    ``peers`` are the watched world ranks. ``on_lost(world_rank, how)`` runs once, on the
    watch thread, with the rank that left and how that was learnt; the watch then ends.
    :meth:`stop` ends it earlier.
    """

    def __init__(
        self,
        session: Session,
        peers: Iterable[int],
        on_lost: Callable[[int, str], None],
        poll_s: float = POLL_S,
    ) -> None:
        self._session = session
        self._peers = tuple(peers)
        self._on_lost = on_lost
        self._poll_s = poll_s
        self._store: Store | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="afd-peer-watch", daemon=True)

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def stop(self, join_timeout_s: float = 2.0) -> None:
        """Stop polling and wait up to ``join_timeout_s`` for the thread to end."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    def _run(self) -> None:
        seen: tuple[int, str] | None = None
        polls = 0
        while not self._stopped.wait(self._poll_s):
            loss = self._poll()
            if loss is None or (seen is not None and loss[0] != seen[0]):
                polls = 0
            seen = loss
            if loss is None:
                continue
            polls += 1
            if polls >= CONFIRM_POLLS:
                if not self._stopped.is_set():
                    self._on_lost(*loss)
                return

    def _poll(self) -> tuple[int, str] | None:
        """The first peer seen gone by this poll (its world rank, how), or None."""
        session = self._session
        try:
            if self._store is None:
                if not listening(session.host, session.port):
                    return self._store_gone("refuses connections")
                self._store = self._connect()
            for rank in self._peers:
                key = session.key("left", rank)
                if self._store.check([key]):
                    return rank, f"it left: {self._store.get(key).decode(errors='replace')}"
        except RuntimeError as exc:
            self._store = None
            return self._store_gone(f"stopped answering: {str(exc).splitlines()[0]}")
        return None

    def _store_gone(self, what: str) -> tuple[int, str] | None:
        """The store host as the lost rank, if it is a watched peer (else None)."""
        if STORE_HOST_RANK not in self._peers:
            return None
        return STORE_HOST_RANK, f"its rendezvous store at {self._session.address} {what}"

    def _connect(self) -> Store:
        import torch.distributed as dist

        return dist.TCPStore(
            self._session.host,
            self._session.port,
            None,
            False,
            timedelta(seconds=STORE_TIMEOUT_S),
            wait_for_workers=False,
        )
