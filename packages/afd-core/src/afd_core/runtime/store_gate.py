"""A shared secret in front of the rendezvous store: only ranks that know it get in.

torch's ``TCPStore`` has no authentication: whoever reaches its port reads and writes
every key. When the deployment carries a secret (:data:`SECRET_ENV`, an environment
variable, so it is never part of the vLLM config that vLLM logs), FFN rank 0 keeps the
store on a loopback port of its own and puts a :class:`StoreGate` on ``host:port``; every
other rank reaches the store through a :class:`StoreTunnel`, a loopback listener whose
connections it carries to the gate. Each carried connection opens with a mutual
challenge and response (HMAC-SHA256 keyed by the secret; the secret never travels)::

    gate   -> tunnel: MAGIC (8 bytes), gate nonce (16)
    tunnel -> gate  : tunnel nonce (16), HMAC(secret, b"tunnel" + gate nonce + tunnel nonce)
    gate   -> tunnel: HMAC(secret, b"gate" + tunnel nonce + gate nonce)

then the bytes of torch's store protocol pass both ways unchanged. A connection that
sends anything else, or not all of it within :data:`HANDSHAKE_S`, is closed and logged
as a warning with its address (never the secret or what it sent); the deployment does
not notice. A tunnel that cannot pass the gate (another secret, or a gate without one)
keeps the reason in :attr:`StoreTunnel.refusal`, which the rendezvous quotes.

What this does not cover: the store's own loopback port on FFN rank 0's host (reachable
by local processes of that host), and the gloo and heartbeat connections, which are made
after the rendezvous (a heartbeat connection must name the session, which only a rank
that passed the gate has read). See docs/network.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import selectors
import socket
import threading
from collections.abc import Callable, Mapping

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: Environment variable holding the deployment's shared secret (any non-empty text).
SECRET_ENV = "AFD_RENDEZVOUS_SECRET"
#: Seconds a new connection has to complete the handshake.
HANDSHAKE_S = 5.0
#: What the gate sends first (and the tunnel checks: "is this an AFD gate?").
MAGIC = b"AFDGATE1"
_NONCE = 16
_MAC = 32
_CHUNK = 1 << 16


def announces_gate(host: str, port: int, wait_s: float = 0.3) -> bool:
    """Whether the listener at ``host:port`` greets with :data:`MAGIC` (a gate: the
    deployment has a secret) within ``wait_s``; torch's store never speaks first."""
    try:
        with socket.create_connection((host, port), timeout=wait_s) as probe:
            probe.settimeout(wait_s)
            return probe.recv(len(MAGIC)) == MAGIC
    except OSError:
        return False


def rendezvous_secret(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The deployment's secret from :data:`SECRET_ENV`, or None when there is none."""
    value = environ.get(SECRET_ENV, "")
    return value.encode() if value else None


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


class _ClosedEarly(ConnectionError):
    """The other side closed before sending all it had to; ``received`` bytes came."""

    def __init__(self, received: int, size: int) -> None:
        super().__init__(f"closed after {received} of {size} bytes")
        self.received = received


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise _ClosedEarly(len(data), size)
        data += chunk
    return data


def _relay(one: socket.socket, other: socket.socket) -> None:
    """Copy bytes both ways until either side closes; then close both."""
    selector = selectors.DefaultSelector()
    selector.register(one, selectors.EVENT_READ, other)
    selector.register(other, selectors.EVENT_READ, one)
    try:
        while True:
            for key, _ in selector.select():
                data = key.fileobj.recv(_CHUNK)  # type: ignore[union-attr]
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        selector.close()
        for sock in (one, other):
            with contextlib.suppress(OSError):
                sock.close()


class _Acceptor:
    """A listening socket and the daemon thread that hands each connection, on a thread
    of its own, to ``serve(conn, address)``."""

    def __init__(
        self,
        listener: socket.socket,
        name: str,
        serve: Callable[[socket.socket, tuple[str, int]], None],
    ) -> None:
        self._listener = listener
        self._serve = serve
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed.is_set():
            try:
                conn, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(
                target=self._serve, args=(conn, address), name=self._thread.name, daemon=True
            ).start()

    def close(self) -> None:
        """Stop accepting (connections already relayed end when their peers close)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(1.0)


class StoreGate:
    """FFN rank 0's side: admits a connection to the store only after the handshake.

    ``listener`` listens on the AFD config's ``host:port``; ``store_address`` is the
    store's loopback address.
    """

    def __init__(
        self, listener: socket.socket, secret: bytes, store_address: tuple[str, int]
    ) -> None:
        self._secret = secret
        self._store_address = store_address
        #: Connections refused so far.
        self.rejected = 0
        self._acceptor = _Acceptor(listener, "afd-store-gate", self._admit)

    def close(self) -> None:
        """Stop admitting connections (those relayed already end with their peers)."""
        self._acceptor.close()

    def _admit(self, conn: socket.socket, address: tuple[str, int]) -> None:
        gate_nonce = secrets.token_bytes(_NONCE)
        try:
            conn.settimeout(HANDSHAKE_S)
            conn.sendall(MAGIC + gate_nonce)
            answer = _recv_exactly(conn, _NONCE + _MAC)
            tunnel_nonce, mac = answer[:_NONCE], answer[_NONCE:]
            if not hmac.compare_digest(
                mac, _mac(self._secret, b"tunnel", gate_nonce, tunnel_nonce)
            ):
                raise PermissionError("it does not know the deployment's secret")
            conn.sendall(_mac(self._secret, b"gate", tunnel_nonce, gate_nonce))
            conn.settimeout(None)
            store = socket.create_connection(self._store_address, timeout=HANDSHAKE_S)
            store.settimeout(None)
        except (OSError, PermissionError) as exc:
            self.rejected += 1
            # A probe that connects and closes without a word (a rank checking that the
            # store listens) is not worth a warning; anything else is.
            quiet = isinstance(exc, _ClosedEarly) and exc.received == 0
            logger.log(
                logging.DEBUG if quiet else logging.WARNING,
                "AFD rendezvous: refused a connection from %s:%d to the store (%s)",
                address[0],
                address[1],
                exc,
            )
            with contextlib.suppress(OSError):
                conn.close()
            return
        _relay(conn, store)


class StoreTunnel:
    """Another rank's side: a loopback port whose connections reach the store through
    the gate at ``gate_address``. :attr:`port` is where the local store client connects.
    """

    def __init__(self, secret: bytes, gate_address: tuple[str, int]) -> None:
        self._secret = secret
        self._gate_address = gate_address
        #: Why the gate did not let this rank in (None while it did, or was not tried).
        self.refusal: str | None = None
        listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = listener.getsockname()[1]
        self._acceptor = _Acceptor(listener, "afd-store-tunnel", self._carry)

    def close(self) -> None:
        """Stop carrying new connections (those carried already end with their peers)."""
        self._acceptor.close()

    def check(self) -> str | None:
        """One handshake with the gate, at once: why it refused this rank, or None."""
        try:
            gate = self._open_gate()
        except PermissionError as exc:
            self.refusal = str(exc)
            return self.refusal
        gate.close()
        return None

    def _carry(self, conn: socket.socket, address: tuple[str, int]) -> None:
        try:
            gate = self._open_gate()
        except PermissionError as exc:
            self.refusal = str(exc)
            with contextlib.suppress(OSError):
                conn.close()
            return
        _relay(conn, gate)

    def _open_gate(self) -> socket.socket:
        """A connection to the gate that passed the handshake; PermissionError saying why
        the gate cannot be passed."""
        host, port = self._gate_address
        try:
            gate = socket.create_connection(self._gate_address, timeout=HANDSHAKE_S)
        except OSError as exc:
            raise PermissionError(f"cannot reach the store at {host}:{port} ({exc})") from exc
        try:
            hello = _recv_exactly(gate, len(MAGIC) + _NONCE)
            if hello[: len(MAGIC)] != MAGIC:
                raise PermissionError("it is not an AFD store gate")
            gate_nonce, tunnel_nonce = hello[len(MAGIC) :], secrets.token_bytes(_NONCE)
            gate.sendall(tunnel_nonce + _mac(self._secret, b"tunnel", gate_nonce, tunnel_nonce))
            proof = _recv_exactly(gate, _MAC)
            if not hmac.compare_digest(
                proof, _mac(self._secret, b"gate", tunnel_nonce, gate_nonce)
            ):
                raise PermissionError("it does not know the deployment's secret")
        except TimeoutError as exc:
            gate.close()
            raise PermissionError(
                f"the store at {host}:{port} did not start the secret handshake within "
                f"{HANDSHAKE_S:g} s: FFN rank 0 runs without {SECRET_ENV}; give every rank "
                "the same secret, or none"
            ) from exc
        except (OSError, PermissionError) as exc:
            gate.close()
            raise PermissionError(
                f"the store at {host}:{port} refused this rank's secret or is not FFN rank "
                f"0's ({exc}); give every rank the same {SECRET_ENV}"
            ) from exc
        gate.settimeout(None)
        return gate
