"""The shared secret in front of the rendezvous store: real TCPStores, real sockets.

Ranks with the deployment's secret share the session; a stranger (garbage bytes, a
wrong secret, no secret) is refused with a clear error and the deployment carries on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any

import pytest

from afd_core.errors import AFDPeerError
from afd_core.runtime.rendezvous import open_session
from afd_core.runtime.store_gate import HANDSHAKE_S, MAGIC, SECRET_ENV, rendezvous_secret
from afd_core.tools.launch import free_ports
from tests.integration.test_gloo_connector import LAYERS, run_attention, run_ffn

pytest.importorskip("torch.distributed", reason="the store is torch's TCPStore")

SECRET = b"correct horse battery staple"
TIMEOUT_S = 10.0


def closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the other side closes (or resets) ``sock`` within ``within_s``."""
    sock.settimeout(within_s)
    end = time.monotonic() + within_s
    try:
        while time.monotonic() < end:
            if not sock.recv(4096):
                return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    return False


def test_ranks_with_the_secret_share_the_session_and_strangers_are_refused() -> None:
    (port,) = free_ports(1)
    master = open_session("127.0.0.1", port, True, TIMEOUT_S, secret=SECRET)
    try:
        master.store.set("afd/probe", "kept")
        # Garbage: the gate sends its challenge, gets nonsense back, closes.
        with socket.create_connection(("127.0.0.1", port)) as stranger:
            assert stranger.recv(len(MAGIC)) == MAGIC
            stranger.sendall(b"\x00garbage" * 8)
            assert closed_by_peer(stranger, HANDSHAKE_S + 2)
        # Silence: closed once the handshake time is up.
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert closed_by_peer(silent, HANDSHAKE_S + 2)
        # A rank with another secret gets a clear error.
        with pytest.raises(AFDPeerError, match=f"refused this rank's secret.*{SECRET_ENV}"):
            open_session("127.0.0.1", port, False, TIMEOUT_S, secret=b"guess")
        # A rank without a secret cannot use the store either, and is told why.
        with pytest.raises(
            AFDPeerError, match=f"requires the deployment's shared secret.*{SECRET_ENV}"
        ):
            open_session("127.0.0.1", port, False, TIMEOUT_S)
        assert master.gate is not None and master.gate.rejected >= 4
        # The deployment did not notice: a rank with the secret joins and reads the store.
        client = open_session("127.0.0.1", port, False, TIMEOUT_S, secret=SECRET)
        assert client.session_id == master.session_id
        assert client.store.get("afd/probe") == b"kept"
        client.close()
    finally:
        master.close()


def test_a_rank_with_a_secret_names_an_ffn_rank_0_without_one() -> None:
    (port,) = free_ports(1)
    master = open_session("127.0.0.1", port, True, TIMEOUT_S)
    try:
        with pytest.raises(AFDPeerError, match=f"runs without {SECRET_ENV}"):
            open_session("127.0.0.1", port, False, TIMEOUT_S, secret=SECRET)
    finally:
        master.close()


def test_the_secret_comes_from_the_environment_only_when_set() -> None:
    assert rendezvous_secret({SECRET_ENV: "s3cret"}) == b"s3cret"
    assert rendezvous_secret({SECRET_ENV: ""}) is None
    assert rendezvous_secret({}) is None


def with_secret(secret: str | None, fn: Any, *args: Any) -> Any:
    """Run ``fn(*args)`` in this rank process with ``secret`` as the deployment's secret."""
    if secret is None:
        os.environ.pop(SECRET_ENV, None)
    else:
        os.environ[SECRET_ENV] = secret
    return fn(*args)


def test_a_deployment_with_a_secret_serves_and_turns_strangers_away(ranks, port):
    """1A1F P2P over gloo with a secret: an attention process without the secret and a
    stream of garbage connections during the rendezvous are refused; the real ranks
    rendezvous and exchange exact results."""
    secret = "s3cret-of-this-deployment"
    counts = [(3,), (1,), (2,)]
    ranks.start("ffn", with_secret, secret, run_ffn, port, 1, 1, 0, len(counts))
    ranks.start("intruder", with_secret, None, run_attention, port, 1, 1, 0, counts, delay_s=1.0)
    ranks.start("attn", with_secret, secret, run_attention, port, 1, 1, 0, counts, delay_s=2.0)
    stop = threading.Event()

    def garbage() -> None:
        while not stop.is_set():
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=1) as stranger,
            ):
                stranger.sendall(os.urandom(64))
            time.sleep(0.05)

    sender = threading.Thread(target=garbage, daemon=True)
    sender.start()
    try:
        out = ranks.join(60)
    finally:
        stop.set()
        sender.join(5)
    assert out["ffn"].ok and out["attn"].ok, out
    assert out["attn"].value == sum(n for (n,) in counts) * LAYERS
    intruder = out["intruder"]
    assert intruder.error_type == "AFDPeerError", intruder
    assert f"requires the deployment's shared secret; set {SECRET_ENV}" in intruder.error
    assert secret not in intruder.error


def test_a_rank_without_the_secret_is_told_why_even_when_the_first_look_misses_the_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded host the gate may greet later than the first look waits: the rank then
    tries the store, fails, looks again for longer, and still names the missing secret."""
    from afd_core.runtime import rendezvous

    looks: list[float] = []
    real = rendezvous.announces_gate

    def late_gate(host: str, port: int, wait_s: float = 0.3) -> bool:
        looks.append(wait_s)
        return False if len(looks) == 1 else real(host, port, wait_s)

    monkeypatch.setattr(rendezvous, "announces_gate", late_gate)
    (port,) = free_ports(1)
    master = open_session("127.0.0.1", port, True, TIMEOUT_S, secret=SECRET)
    try:
        with pytest.raises(
            AFDPeerError, match=f"requires the deployment's shared secret.*{SECRET_ENV}"
        ):
            open_session("127.0.0.1", port, False, 3.0)
        assert looks == [0.3, rendezvous.SLOW_GATE_PROBE_S]
    finally:
        master.close()
