"""``PeerWatch``: every rank learns within seconds that a peer is gone, idle or busy.

The data transports report a lost peer only when a transfer is pending, and not always
then: gloo has been seen to miss a peer that closed as a send was posted (its wait ended
at its own timeout), and NCCL reports nothing until its timeout. So every rank also keeps
one plain TCP connection to each peer it exchanges with, independent of gloo and NCCL:

* after the rendezvous each rank listens on an ephemeral port of its own address towards
  ``config.host`` (:func:`local_address_towards`: loopback when ``host`` is, else the
  address of the interface that routes to FFN rank 0; that address only) and publishes
  it in the session store; of each pair the
  higher world rank connects, and opens with a greeting naming itself and the session;
* a daemon thread sends a heartbeat byte every :data:`HEARTBEAT_S` and reads what comes
  back: end-of-file or a reset (the peer process ended: the kernel closes its sockets at
  once, crash or not), a goodbye byte (the peer closed its connector) or
  :data:`SILENCE_S` without a byte (the peer's host is unreachable) make the peer lost;
* on the first lost peer ``on_lost(error)`` runs once on that thread with an
  :class:`~afd_core.errors.AFDPeerError` naming the peer and what happened; the
  connector records it and interrupts its transports, so blocked waits end with it;
* a goodbye is not a loss: the peer finished what it had started (its last step is
  complete on its side) and sends nothing more. ``on_departed(peer, error)`` runs for
  each such peer and the watch keeps watching the others; the connector fails at its
  next step boundary, so the steps still in flight with other peers can finish.

Bound: a peer that exits or is killed is seen within milliseconds (the socket closes);
a silent one within :data:`SILENCE_S` (5 s). Closing the watch sends the goodbye, so the
peers learn that this rank left rather than crashed. A rank about to hold the GIL for
seconds (a profiler writing its trace) announces a busy spell (:func:`busy`); its peers
then tolerate its silence up to the AFD timeout, until its next heartbeat.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from afd_core.errors import AFDPeerError
from afd_core.runtime.rendezvous import Session

#: Seconds between two heartbeats a rank sends each peer.
HEARTBEAT_S = 0.5
#: Seconds without any byte from a peer after which it counts as lost.
SILENCE_S = 5.0
_HEARTBEAT = b"\x00"
_GOODBYE = b"\x01"
_BUSY = b"\x02"
_open_watches: weakref.WeakSet[PeerWatch] = weakref.WeakSet()
_GREETING = "afd-liveness {session} {rank}\n"


def local_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (``host`` itself on FFN rank 0).

    Asks the kernel's routing table (a UDP socket connected to ``host`` sends nothing).
    A listener bound to it listens on that one address (loopback for a loopback
    ``host``), not on every interface of the machine.
    """
    family = _family(host)
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # the port does not matter: nothing is sent
        return str(probe.getsockname()[0])


def _family(address: str) -> socket.AddressFamily:
    return socket.getaddrinfo(address, None, type=socket.SOCK_DGRAM)[0][0]


@dataclass
class _Link:
    peer: int
    sock: socket.socket
    last_heard: float
    #: Seconds of silence tolerated from the peer: SILENCE_S, or the busy allowance
    #: after it announced a busy spell (until its next heartbeat).
    allowed_silence: float = SILENCE_S


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Announce a busy spell of this process to the peers of every open watch in it.

    For work that holds the GIL for seconds, so that no heartbeat can be sent or read
    (a torch profiler writing its trace): the peers then tolerate silence from this rank
    up to their AFD timeout (``afd_process_group_timeout_s``) instead of
    :data:`SILENCE_S` until the spell ends (its heartbeats say "busy" meanwhile); this
    rank does not count its peers' silence meanwhile either. A peer whose process ends
    is still seen at once (its connection closes).
    """
    watches = list(_open_watches)
    for watch in watches:
        watch.begin_busy()
    try:
        yield
    finally:
        for watch in watches:
            watch.end_busy()


class PeerWatch:
    """One rank's liveness links to its peers (see the module docstring).

    ``describe(world_rank)`` names a peer in errors; ``on_lost(error)`` is called once,
    on the watch thread, for the first peer lost (after which the watch ends);
    ``on_departed(peer, error)`` for every peer that said goodbye before.
    """

    def __init__(
        self,
        links: dict[int, socket.socket],
        describe: Callable[[int], str],
        on_lost: Callable[[AFDPeerError], None],
        on_departed: Callable[[int, AFDPeerError], None],
        name: str,
        busy_allowance_s: float = SILENCE_S,
    ) -> None:
        now = time.monotonic()
        self._links = [_Link(peer, sock, now) for peer, sock in links.items()]
        self._busy_allowance_s = busy_allowance_s
        self._busy = False
        self._describe = describe
        self._on_lost = on_lost
        self._on_departed = on_departed
        self._stop = threading.Event()
        self._links_lock = threading.Lock()  # the thread drops departed links
        self._lost = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _open_watches.add(self)

    @classmethod
    def open(
        cls,
        session: Session,
        host: str,
        world_rank: int,
        peers: tuple[int, ...],
        timeout_s: float,
        describe: Callable[[int], str],
        on_lost: Callable[[AFDPeerError], None],
        on_departed: Callable[[int, AFDPeerError], None],
    ) -> PeerWatch:
        """Listen, publish, connect to every peer (bounded by ``timeout_s``), start watching.

        ``host`` is FFN rank 0's address (the AFD config's). Raises AFDPeerError when a
        peer's link cannot be made in time.
        """
        own = local_address_towards(host)
        listener = socket.create_server((own, 0), family=_family(own))
        links: dict[int, socket.socket] = {}
        try:
            address = f"{own}:{listener.getsockname()[1]}"
            session.store.set(session.key("liveness", world_rank), address)
            deadline = time.monotonic() + timeout_s
            for peer in peers:
                if peer < world_rank:
                    links[peer] = _connect(session, peer, world_rank, deadline, describe)
            for _ in [p for p in peers if p > world_rank]:
                peer, sock = _accept(listener, session, deadline, describe)
                links[peer] = sock
        except BaseException:
            for sock in links.values():
                sock.close()
            raise
        finally:
            listener.close()
        return cls(
            links,
            describe,
            on_lost,
            on_departed,
            f"afd-peer-watch-w{world_rank}",
            busy_allowance_s=max(timeout_s, SILENCE_S),
        )

    def begin_busy(self) -> None:
        """Tell every peer this rank starts a busy spell (see :func:`busy`)."""
        with self._links_lock:
            self._busy = True
            for link in self._links:
                with contextlib.suppress(OSError):
                    link.sock.sendall(_BUSY)

    def end_busy(self) -> None:
        """The busy spell is over: count the peers' silence from now on again."""
        with self._links_lock:
            self._busy = False
            now = time.monotonic()
            for link in self._links:
                link.last_heard = max(link.last_heard, now)
                with contextlib.suppress(OSError):
                    link.sock.sendall(_HEARTBEAT)

    def close(self) -> None:
        """Say goodbye to every peer and end the thread (idempotent)."""
        _open_watches.discard(self)
        if self._stop.is_set():
            return
        with self._links_lock:
            self._stop.set()
            for link in self._links:
                with contextlib.suppress(OSError):
                    link.sock.sendall(_GOODBYE)
        if self._thread is not threading.current_thread():
            self._thread.join(2 * HEARTBEAT_S + 1.0)
        with self._links_lock:
            for link in self._links:
                with contextlib.suppress(OSError):
                    link.sock.close()

    def _run(self) -> None:
        next_beat = 0.0
        while self._links and not self._stop.is_set() and not self._lost:
            now = time.monotonic()
            if now >= next_beat:
                beat = _BUSY if self._busy else _HEARTBEAT  # a busy spell lasts until it ends
                for link in self._links:
                    try:
                        link.sock.sendall(beat)
                    except OSError as exc:
                        self._lose(link.peer, f"its liveness connection failed ({exc})")
                        return
                next_beat = now + HEARTBEAT_S
            socks = [link.sock for link in self._links]
            try:
                readable, _, _ = select.select(socks, [], [], HEARTBEAT_S / 2)
            except (OSError, ValueError):
                return  # closed under us by close()
            for link in list(self._links):
                if link.sock in readable and not self._read(link):
                    return
                silent_s = time.monotonic() - link.last_heard
                if link in self._links and not self._busy and silent_s > link.allowed_silence:
                    self._lose(
                        link.peer,
                        f"sent no heartbeat for {link.allowed_silence:g} s (host unreachable?)",
                    )
                    return

    def _read(self, link: _Link) -> bool:
        """Take what ``link`` sent; False once a peer is lost (the watch then ends)."""
        try:
            data = link.sock.recv(4096)
        except ConnectionResetError:
            data = b""  # the peer's socket closed with bytes unread: it ended too
        except OSError as exc:
            if self._stop.is_set():
                return False
            self._lose(link.peer, f"its liveness connection broke ({exc})")
            return False
        if _GOODBYE in data:
            self._depart(link)
            return True
        if not data:
            self._lose(link.peer, "its process ended (its liveness connection closed)")
            return False
        link.last_heard = time.monotonic()
        # The last signal wins: a busy spell lasts until the next heartbeat.
        if data.rfind(_BUSY) > data.rfind(_HEARTBEAT):
            link.allowed_silence = self._busy_allowance_s
        else:
            link.allowed_silence = SILENCE_S
        return True

    def _depart(self, link: _Link) -> None:
        with self._links_lock:
            self._links.remove(link)
            with contextlib.suppress(OSError):
                link.sock.close()
        if not self._stop.is_set():
            error = AFDPeerError(
                f"AFD: {self._describe(link.peer)} left: it closed its connector (it was "
                "stopped or failed; see its log)"
            )
            self._on_departed(link.peer, error)

    def _lose(self, peer: int, what: str) -> None:
        if self._stop.is_set() or self._lost:
            return
        self._lost = True
        self._on_lost(AFDPeerError(f"AFD: {self._describe(peer)} is gone: {what}"))


def _connect(
    session: Session, peer: int, world_rank: int, deadline: float, describe: Callable[[int], str]
) -> socket.socket:
    """Connect to ``peer``'s listener (its address from the store) and greet it."""
    store = session.store
    key = session.key("liveness", peer)
    while not store.check([key]):
        if time.monotonic() >= deadline:
            raise AFDPeerError(f"AFD: {describe(peer)} published no liveness address in time")
        time.sleep(0.01)
    host, _, port = store.get(key).decode().rpartition(":")
    try:
        sock = socket.create_connection(
            (host, int(port)), timeout=max(deadline - time.monotonic(), 0.1)
        )
        sock.sendall(_GREETING.format(session=session.session_id, rank=world_rank).encode())
    except OSError as exc:
        raise AFDPeerError(
            f"AFD: cannot open the liveness connection to {describe(peer)} at {host}:{port} ({exc})"
        ) from exc
    sock.settimeout(None)
    return sock


def _accept(
    listener: socket.socket, session: Session, deadline: float, describe: Callable[[int], str]
) -> tuple[int, socket.socket]:
    """Accept one peer's connection and read its greeting; strangers are dropped."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AFDPeerError("AFD: a peer did not open its liveness connection in time")
        listener.settimeout(remaining)
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            greeting = _read_greeting(sock).split()
        except OSError:
            sock.close()
            continue
        if (
            len(greeting) == 3
            and greeting[0] == "afd-liveness"
            and greeting[1] == session.session_id
        ):
            with contextlib.suppress(ValueError):
                sock.settimeout(None)
                return int(greeting[2]), sock
        sock.close()  # not one of ours


def _read_greeting(sock: socket.socket) -> str:
    """The greeting line, read byte by byte: a buffered reader could swallow the
    heartbeats (or the goodbye) that follow it."""
    line = bytearray()
    while len(line) < 256:
        byte = sock.recv(1)
        if not byte or byte == b"\n":
            break
        line += byte
    return line.decode(errors="replace")
