"""``P2pGlooAFDConnector``: the reference connector, P2P messages over gloo (CPU tensors).

Rendezvous through :mod:`afd_core.rendezvous`, then one dedicated
``ProcessGroupGloo`` over the whole AFD world (never torch's default group), created
directly on a PrefixStore of the session. The protocol itself lives in
:class:`~afd_core.connectors.p2p_protocol.P2pProtocolConnector`; this module supplies
the transport primitives.

Three facts about gloo in torch 2.13 shape the primitives (see ``docs/wire-protocol.md``):

* a send/recv ``Work`` reports ``is_completed()`` only after ``wait()`` returned, so
  waits block in ``wait(timeout)`` (the GIL is released meanwhile);
* a wait that times out closes every pair of the process group ("Application timeout
  caused pair closure"), and ``abort()``/``shutdown()`` do not wake a blocked wait. So
  data waits pass the remaining ``afd_process_group_timeout_s`` (a timeout is fatal
  anyway), control receives wait practically forever, and :meth:`close` wakes every
  waiter on purpose by letting a dummy receive time out after 1 ms;
* a message larger than the posted receive aborts the receiving process, hence the
  fixed-size control frames and the sender-side checks of the protocol.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from afd_core.connectors.p2p_protocol import P2pProtocolConnector, Purpose
from afd_core.connectors.p2p_wire import TAG_WAKE
from afd_core.errors import AFDPeerError, AFDShutdown
from afd_core.rendezvous import Hello, Session, exchange_hello, open_session

if TYPE_CHECKING:
    import torch

#: How long a control receive may wait: "forever" without overflowing gloo's clock.
_FOREVER = timedelta(days=3650)


class P2pGlooAFDConnector(P2pProtocolConnector):
    """AFD connector over a dedicated gloo process group (CPU, any platform).

    ``connector_extra_config`` takes no fields. World order: FFN ranks first; FFN rank 0
    hosts the rendezvous store at ``config.host:config.port``.
    """

    name = "P2pGlooAFDConnector"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: Session | None = None
        self._pg: Any = None
        self._interrupted = False

    def _initialize(self) -> None:
        try:
            self._open()
        except BaseException:
            self._close()  # free the port and any half-made group at once
            raise

    def _open(self) -> None:
        import torch.distributed as dist

        timeout_s = self._timeout_s
        should_stop = lambda: self.is_closed  # noqa: E731
        self._interrupted = False
        self._session = open_session(
            self.config.host, self.config.port, self.world_rank == 0, timeout_s, should_stop
        )
        exchange_hello(
            self._session,
            Hello.of(self.config, self.role_rank, self.wire),
            self.topology,
            timeout_s,
            should_stop,
        )
        try:
            self._pg = dist.ProcessGroupGloo(
                self._session.prefix_store("gloo"),
                self.world_rank,
                self.topology.world_size,
                timedelta(seconds=timeout_s),
            )
        except RuntimeError as exc:
            raise AFDPeerError(
                f"AFD: creating the gloo group of {self.topology.world_size} ranks at "
                f"{self._session.address} failed ({exc}); a rank stopped right after the "
                "rendezvous — see the logs of the other ranks"
            ) from exc
        if self.is_closed:
            raise AFDShutdown(f"AFD: {self.name} was closed during initialize()")
        self._start_protocol()

    def _close(self) -> None:
        self._interrupt()
        self._stop_protocol()
        pg, self._pg = self._pg, None
        if pg is not None:
            with contextlib.suppress(RuntimeError):  # pairs already closed: nothing to do
                pg.shutdown()
        self._session = None

    def _wake_waiters(self) -> None:
        super()._wake_waiters()
        self._interrupt()

    def _interrupt(self) -> None:
        """Make every wait of this process on the group fail now (gloo has no cancel)."""
        pg = self._pg
        if pg is None or self._interrupted:
            return
        self._interrupted = True
        import torch

        peer = self.topology.peers_of(self.config.role, self.role_rank)[0]
        # The intended timeout (gloo then closes every pair), or the pairs are closed.
        with contextlib.suppress(RuntimeError):
            work = pg.recv([torch.empty(1, dtype=torch.uint8)], peer, TAG_WAKE)
            work.wait(timedelta(milliseconds=1))

    def _group(self) -> Any:
        pg = self._pg
        if pg is None:
            raise AFDShutdown(f"AFD: {self.name} is closed")
        return pg

    def _post_send(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        pg = self._group()
        try:
            return pg.send([buf], peer, tag)
        except RuntimeError as exc:
            raise self._peer_failure(peer, "a send", str(exc), False) from exc

    def _post_recv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        pg = self._group()
        try:
            return pg.recv([buf], peer, tag)
        except RuntimeError as exc:
            raise self._peer_failure(peer, "a receive", str(exc), False) from exc

    def _wait(self, handle: Any, peer: int, deadline: float | None, what: Purpose) -> None:
        if deadline is None:
            timeout = _FOREVER
        else:
            timeout = timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        try:
            handle.wait(timeout)
        except RuntimeError as exc:
            detail = str(exc).split("\n", 1)[0]
            timed_out = "Timed out" in detail and not self.is_closed
            raise self._peer_failure(peer, what, detail, timed_out) from exc
