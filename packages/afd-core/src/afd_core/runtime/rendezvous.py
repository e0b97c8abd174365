"""Store-based rendezvous of an AFD world, before any process group exists.

FFN rank 0 hosts a ``torch.distributed.TCPStore`` at ``config.host:config.port`` (bound
to that address only, see :func:`bind_listener`; behind a secret handshake when the
deployment has a secret, see :mod:`afd_core.runtime.store_gate`) and writes a random session
id; every other rank connects as a client (retrying until
``afd_process_group_timeout_s``, so the roles can start in either order) and reads it.
All keys live under ``afd/<session>/`` so a new deployment never reads the records of an
old one. Each rank then writes a *hello* record (protocol versions, the settings both
roles must share, its role and rank, its connector's wire spec) and compares the records
of every other rank of the world, its peers first. The first difference aborts the
rendezvous for everyone: the rank writes ``afd/<session>/abort`` and raises
AFDProtocolError naming the field and which side has which value; the others find the
abort record and raise quoting it.

Hello records are keyed by role and role rank (not world rank), so ranks that disagree
on the world size still find each other's records and report the difference. Only after
this check does a connector create its process group, whose world size then agrees.

Reusable by every connector that has a TCP reachable FFN rank 0; torch is imported only
when a store is opened.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from afd_core.errors import (
    AFDConfigError,
    AFDError,
    AFDPeerError,
    AFDProtocolError,
    AFDShutdown,
)
from afd_core.runtime import seats
from afd_core.runtime.store_gate import SECRET_ENV, StoreGate, StoreTunnel, announces_gate
from afd_core.topology import Role, Topology
from afd_core.wire.metadata import ControlPayload, TransferHeader

if TYPE_CHECKING:
    from torch.distributed import Store

    from afd_core.config import AFDConfig
    from afd_core.connector import WireSpec

#: Versions of what the two roles exchange; any difference fails the rendezvous.
PROTOCOL: dict[str, int] = {
    "rendezvous": 2,
    "control": ControlPayload.VERSION,
    "data": TransferHeader.VERSION,
}

#: Seconds the second look for a store gate waits for its greeting, after the store
#: could not be used (a loaded host may take longer than the first look's 0.3 s).
SLOW_GATE_PROBE_S = 3.0
_POLL_START_S = 0.005
_POLL_MAX_S = 0.1


def _describe(role: Role, rank: int, world_rank: int) -> str:
    return f"{'FFN' if role == 'ffn' else 'attention'} rank {rank} (world rank {world_rank})"


@dataclass(frozen=True)
class Hello:
    """What one rank tells the others before a process group exists."""

    role: Role
    role_rank: int
    world_rank: int
    protocol: dict[str, int]
    shared: dict[str, Any]
    wire: dict[str, Any]

    @classmethod
    def of(cls, config: AFDConfig, role_rank: int, wire: WireSpec) -> Hello:
        """The record of ``role_rank`` of ``config.role`` using ``wire``."""
        return cls(
            role=config.role,
            role_rank=role_rank,
            world_rank=config.topology.world_rank(config.role, role_rank),
            protocol=dict(PROTOCOL),
            shared=json.loads(json.dumps(config.shared_view())),
            wire=json.loads(json.dumps(asdict(wire))),
        )

    def encode(self) -> str:
        """JSON text with sorted keys."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, text: str | bytes) -> Hello:
        """Parse :meth:`encode` output; AFDProtocolError for anything else."""
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise AFDProtocolError(
                f"AFD rendezvous: unreadable hello record ({exc}); the peer runs a different "
                "afd-core version: install the same version on both roles"
            ) from exc

    @property
    def name(self) -> str:
        """``"attention rank 0 (world rank 1)"``."""
        return _describe(self.role, self.role_rank, self.world_rank)


def compare_hello(mine: Hello, theirs: Hello) -> str | None:
    """The message that explains how ``theirs`` differs from ``mine``, or None.

    Compares protocol versions, the shared settings and the wire spec.
    """
    sections = (
        ("protocol", "protocol.", "install the same afd-core version on both roles"),
        ("shared", "", "start both roles with the same AFD config"),
        ("wire", "wire.", "serve the same model with the same dtype on both roles"),
    )
    me = f"this {mine.role} rank {mine.role_rank}"
    diffs, advice = [], []
    for attr, prefix, hint in sections:
        a, b = getattr(mine, attr), getattr(theirs, attr)
        differing = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        for key in differing:
            diffs.append(f"{me} has {prefix}{key}={a.get(key)!r}, {theirs.name} has {b.get(key)!r}")
        if differing:
            advice.append(hint)
    if not diffs:
        return None
    return "AFD rendezvous: " + "; ".join(diffs) + "; " + " and ".join(advice)


@dataclass
class Session:
    """An open rendezvous store and the session it namespaces keys with."""

    store: Store
    session_id: str
    address: str
    #: True on FFN rank 0, whose process serves the store (it goes when that rank closes).
    hosting: bool = False
    #: The secret handshake in front of the store (FFN rank 0's gate, another rank's
    #: tunnel), when the deployment has a secret.
    gate: StoreGate | StoreTunnel | None = None

    def close(self) -> None:
        """Stop the gate or tunnel, if any (the store goes with the last reference)."""
        if self.gate is not None:
            self.gate.close()

    def key(self, *parts: object) -> str:
        """``afd/<session>/<parts joined by '/'>``."""
        return "/".join(("afd", self.session_id, *map(str, parts)))

    def link(self, attention_rank: int, ffn_rank: int, generation: int) -> Session:
        """The namespace of the link of its own between an attention rank and an FFN rank
        (generation ``generation`` of the attention rank's seat, see :mod:`afd_core.runtime.seats`):
        its keys live under ``afd/<session>/link/a<rank>/f<rank>/g<gen>/``. The store is
        this session's; closing the link's session closes nothing."""
        return self.group(f"link/a{attention_rank}/f{ffn_rank}/g{generation}")

    def group(self, name: str) -> Session:
        """The namespace ``afd/<session>/<name>/`` of a group of ranks of their own (a
        link, the FFN ranks' group); closing it closes nothing."""
        return Session(self.store, f"{self.session_id}/{name}", self.address)

    def prefix_store(self, name: str) -> Store:
        """A PrefixStore for a process group created in this session."""
        import torch.distributed as dist

        return dist.PrefixStore(self.key(name) + "/", self.store)


def _check_stop(should_stop: Callable[[], bool]) -> None:
    if should_stop():
        raise AFDShutdown("AFD rendezvous: the connector was closed while waiting for peers")


def open_session(
    host: str,
    port: int,
    is_master: bool,
    timeout_s: float,
    should_stop: Callable[[], bool] = lambda: False,
    secret: bytes | None = None,
) -> Session:
    """Host (FFN rank 0) or join the rendezvous store and return its session.

    A client waits up to ``timeout_s`` for the master to listen and to publish the
    session id (AFDPeerError naming the address otherwise); ``should_stop`` is polled
    and makes the wait raise AFDShutdown. With a ``secret`` (the deployment's, see
    :mod:`afd_core.runtime.store_gate`) the store is reached only through the secret handshake;
    a client whose secret the gate refuses raises AFDPeerError saying so.
    """
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    address = f"{host}:{port}"
    timeout = timedelta(seconds=timeout_s)
    if is_master:
        return _host_session(host, port, timeout, secret)
    late = AFDPeerError(
        f"AFD rendezvous: FFN rank 0 (world rank 0) did not open the store at {address} "
        f"within {timeout_s:g} s; start the FFN role, or check host/port"
    )
    _wait_until(lambda: _listening(host, port), deadline, should_stop, late)
    tunnel = _pass_gate(host, port, secret)
    store_host, store_port = ("127.0.0.1", tunnel.port) if tunnel else (host, port)
    try:
        remaining = timedelta(seconds=max(deadline - time.monotonic(), 1.0))
        store = dist.TCPStore(
            store_host, store_port, None, False, remaining, wait_for_workers=False
        )
        _wait_until(lambda: store.check(["afd/session"]), deadline, should_stop, late)
        session_id = store.get("afd/session").decode()
    except AFDError:
        if tunnel is not None:
            tunnel.close()
        raise
    except RuntimeError as exc:
        if tunnel is not None:
            tunnel.close()
            if tunnel.refusal:
                raise AFDPeerError(f"AFD rendezvous: {tunnel.refusal}") from exc
        elif announces_gate(host, port, wait_s=SLOW_GATE_PROBE_S):  # a gate the fast probe missed
            raise _secret_required(host, port) from exc
        raise AFDPeerError(
            f"AFD rendezvous: lost the store at {address} ({exc}); FFN rank 0 stopped (see "
            f"its log), or it requires a shared secret ({SECRET_ENV}) that this rank lacks"
        ) from exc
    return Session(store, session_id, address, gate=tunnel)


def _pass_gate(host: str, port: int, secret: bytes | None) -> StoreTunnel | None:
    """The tunnel through FFN rank 0's gate (None without a secret), checked by one
    handshake now; AFDPeerError when this rank's secret, or its lack of one, does not
    match FFN rank 0's."""
    if secret is None:
        if announces_gate(host, port):
            raise _secret_required(host, port)
        return None
    tunnel = StoreTunnel(secret, (host, port))
    refusal = tunnel.check()
    if refusal is not None:
        tunnel.close()
        raise AFDPeerError(f"AFD rendezvous: {refusal}")
    return tunnel


def _secret_required(host: str, port: int) -> AFDPeerError:
    return AFDPeerError(
        f"AFD rendezvous: FFN rank 0's store at {host}:{port} requires the deployment's "
        f"shared secret; set {SECRET_ENV} for this rank as for the others"
    )


def _host_session(host: str, port: int, timeout: timedelta, secret: bytes | None) -> Session:
    """FFN rank 0: the store on ``host:port``, or, with a secret, on a loopback port
    behind a :class:`~afd_core.runtime.store_gate.StoreGate` on ``host:port``."""
    import torch.distributed as dist

    address = f"{host}:{port}"
    listener = bind_listener(host, port)
    inner = bind_listener("127.0.0.1", 0) if secret else listener
    store_host, store_port = inner.getsockname()[:2]
    try:
        store = dist.TCPStore(
            store_host,
            store_port,
            None,
            True,
            timeout,
            wait_for_workers=False,
            master_listen_fd=inner.fileno(),
        )
    except RuntimeError as exc:
        listener.close()
        inner.close()
        raise AFDConfigError(
            f"AFD rendezvous: FFN rank 0 cannot host the store on {address} ({exc})"
        ) from exc
    inner.detach()  # the store owns the descriptor now
    gate = StoreGate(listener, secret, (store_host, store_port)) if secret else None
    session = Session(store, secrets.token_hex(8), address, hosting=True, gate=gate)
    store.set("afd/session", session.session_id)
    return session


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` only (``port`` 0: any free port).

    torch's ``TCPStore`` binds its own listener to every interface (IPv4 and IPv6)
    whatever host it is given; handed this socket's descriptor (``master_listen_fd``)
    it listens where the AFD config says. Raises AFDConfigError when the address cannot
    be bound (port in use, host not an address of this machine).
    """
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        raise AFDConfigError(
            f"AFD rendezvous: FFN rank 0 cannot resolve host {host!r} ({exc}); set the AFD "
            "config's host to an address of this machine"
        ) from exc
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(sockaddr)
        listener.listen(socket.SOMAXCONN)
    except OSError as exc:
        listener.close()
        raise AFDConfigError(
            f"AFD rendezvous: FFN rank 0 cannot listen on {host}:{port} ({exc}); another "
            "process uses this port (stop it or set a free port in the AFD config), or the "
            "host is not an address of this machine"
        ) from exc
    return listener


def _listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at host:port (probe without torch noise).

    A probe of a local port in the OS's ephemeral range that nobody listens on can
    connect to itself (TCP simultaneous open, when the OS picks that very port as the
    probe's source); such a connection is not a listener.
    """
    try:
        with socket.create_connection((host, port), timeout=0.5) as probe:
            return not is_self_connection(probe)
    except OSError:
        return False


def is_self_connection(sock: socket.socket) -> bool:
    """Whether the connected ``sock`` is connected to itself (same local and peer address)."""
    return sock.getsockname() == sock.getpeername()


def _wait_until(
    ready: Callable[[], bool],
    deadline: float,
    should_stop: Callable[[], bool],
    late: Exception,
) -> None:
    delay = _POLL_START_S
    while not ready():
        _check_stop(should_stop)
        if time.monotonic() >= deadline:
            raise late
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)


def exchange_hello(
    session: Session,
    me: Hello,
    topology: Topology,
    peers: tuple[int, ...],
    timeout_s: float,
    should_stop: Callable[[], bool] = lambda: False,
    seated: bool = False,
) -> int:
    """Publish ``me`` and check the hello record of every other rank of ``topology``.

    ``peers`` (the world ranks ``me`` exchanges data with, by its pattern) come first.
    Raises AFDProtocolError on the first difference (after writing the abort record) or
    when another rank aborted, AFDPeerError when a rank does not arrive within
    ``timeout_s``, AFDShutdown when ``should_stop`` turns true. A second rank with the
    same role and role rank (two servers started with one ``role_rank``) aborts the
    rendezvous at once, and every rank then raises AFDProtocolError naming that rank.

    With ``seated`` (connectors that let an attention rank be replaced, see
    :mod:`afd_core.runtime.seats`) an attention rank that joins a running world as a rank whose
    seat was held is a replacement: it waits for the seat to be vacated, compares its
    record with everyone's and fails alone (no abort record: the deployment keeps
    serving) on a difference or when the seat stays held. Returns the generation of the
    seat this rank took: 0 at the world's start.
    """
    store = session.store
    deadline = time.monotonic() + timeout_s
    abort_key = session.key("abort")
    generation = 0  # above 0: this rank replaces one that left a running world
    replaceable = seated and me.role == "attention"
    try:
        joined = store.add(session.key("joined", me.role, me.role_rank), 1)
        if joined > 1 and replaceable and seats.is_seated(session, me.role_rank):
            generation = joined - 1
            seats.claim_vacated_seat(session, me.role_rank, generation, should_stop)
        elif joined > 1:
            count = topology.num_ffn_ranks if me.role == "ffn" else topology.num_attention_ranks
            problem = (
                f"AFD rendezvous: {me.name} joined twice: a second {me.role} server was "
                f"started as {me.role} rank {me.role_rank}; give each {me.role} server its "
                f"own role_rank (0..{count - 1})"
            )
            _abort(session, topology, problem)
        store.set(session.key("hello", me.role, me.role_rank), me.encode())
        others = [w for w in range(topology.world_size) if w != me.world_rank and w not in peers]
        pending = [topology.role_of_world_rank(w) for w in (*peers, *others)]
        delay = _POLL_START_S
        while pending:
            _check_stop(should_stop)
            arrived = [
                (role, rank)
                for role, rank in pending
                if store.check([session.key("hello", role, rank)])
            ]
            for role, rank in arrived:
                theirs = Hello.decode(store.get(session.key("hello", role, rank)))
                problem = compare_hello(me, theirs)
                if problem is not None and generation:
                    seats.answer(session, me.role_rank, generation, problem)
                    raise AFDProtocolError(problem)
                if problem is not None:
                    _abort(session, topology, problem, f" (reported by {me.name})")
                pending.remove((role, rank))
            if not pending:
                break
            if store.check([abort_key]):  # after our own comparisons: report our view first
                reason = store.get(abort_key).decode()
                store.add(session.key("abort_read"), 1)
                _linger_for_readers(session, topology)
                raise AFDProtocolError(f"AFD rendezvous aborted by another rank: {reason}")
            if time.monotonic() >= deadline:
                role, rank = pending[0]
                raise AFDPeerError(
                    f"AFD rendezvous: {_describe(role, rank, topology.world_rank(role, rank))} "
                    f"did not arrive within {timeout_s:g} s at {session.address}; start it, "
                    "or check host/port/num_attention_ranks/num_ffn_ranks"
                )
            if not arrived:
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
        if replaceable:
            seats.answer(session, me.role_rank, generation, None)
    except AFDError:
        raise
    except RuntimeError as exc:
        raise AFDPeerError(
            f"AFD rendezvous: lost the store at {session.address} ({exc}); FFN rank 0 "
            "stopped — see its log"
        ) from exc
    return generation


#: Seconds FFN rank 0 (the store's host) waits, after an abort, for the ranks that joined
#: to read the abort record before its store goes away with it.
ABORT_LINGER_S = 2.0


def _abort(session: Session, topology: Topology, problem: str, signed: str = "") -> NoReturn:
    """Publish ``problem`` as the session's abort record (first writer wins) and raise it.

    On the store's host, first wait (at most :data:`ABORT_LINGER_S`) until every other
    rank that joined has read the record, so they all report the reason rather than a
    lost store.
    """
    store = session.store
    store.compare_set(session.key("abort"), "", problem + signed)
    store.add(session.key("abort_read"), 1)
    _linger_for_readers(session, topology)
    raise AFDProtocolError(problem)


def _linger_for_readers(session: Session, topology: Topology) -> None:
    """On the store's host: wait until every rank that joined has read the abort record
    (each counts itself in ``abort_read``), at most :data:`ABORT_LINGER_S`."""
    if not session.hosting:
        return
    store = session.store
    joined = sum(
        store.add(session.key("joined", role, rank), 0)
        for role, count in (("ffn", topology.num_ffn_ranks),
                            ("attention", topology.num_attention_ranks))
        for rank in range(count)
    )  # fmt: skip
    deadline = time.monotonic() + ABORT_LINGER_S
    while store.add(session.key("abort_read"), 0) < joined and time.monotonic() < deadline:
        time.sleep(0.01)
