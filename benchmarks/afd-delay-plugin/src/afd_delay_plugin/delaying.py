"""``DelayingTransport``: a transport decorator that holds every sent message for a set time.

It models a link whose one-way latency is ``delay_s()`` more than the wrapped
transport's (a function, read at every send, so that a benchmark can change the delay of
running servers: :class:`DelaySetting`):

* :meth:`DelayingTransport.post_send` copies the tensor (host memory only), queues the
  copy with its release time (now + ``delay_s()``) and returns at once; the returned
  transfer is complete for the caller (the link has taken the message), so the caller
  may reuse its tensor after waiting for it, as the contract allows;
* one thread per transport posts the queued copies on the wrapped transport in posting
  order, each at its release time, and waits for each send within ``timeout_s``;
* receives and every other call go to the wrapped transport unchanged.

The link thread needs Python's GIL for a moment at each release time. With CPython's
default switch interval (5 ms) a thread that computes (an attention stage running the
model) may keep it that long, which would add up to 5 ms to the delay exactly when the
other stage computes, and so charge two stages a latency one stage never sees (measured:
docs/performance.md). The transport therefore lowers this process's switch interval to
:data:`SWITCH_INTERVAL_S`, with every delay, 0 included, so that the baseline pays the
same switching cost.

A failed send is kept and raised by the next post or wait of this process; the wrapped
transport's failures on receives are raised as they are. So the library facts the
endpoints rely on (posting order per pair, bounded waits, interrupt) hold as for the
wrapped transport. Importing this module imports no torch.
"""

from __future__ import annotations

import mmap
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from afd_core.dataplane.transport import PeerTransport, Transfer, TransferFailed, Transport

if TYPE_CHECKING:
    import torch

#: The ``work`` of a send this transport has taken: complete for the caller at once.
_TAKEN = object()
_JOIN_S = 5.0
#: The switch interval this transport sets (seconds): far below the delays it models.
SWITCH_INTERVAL_S = 50e-6


class DelaySetting:
    """A delay in microseconds that processes share through an 8-byte file: the benchmark
    writes it (:meth:`write`), every delaying transport reads it at each send
    (:meth:`seconds`)."""

    _FORMAT = "<q"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.exists() or self.path.stat().st_size != 8:
            self.path.write_bytes(struct.pack(self._FORMAT, 0))
        with open(self.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 8)

    def write(self, delay_us: int) -> None:
        """Set the delay of every transport reading this file (from its next send)."""
        if delay_us < 0:
            raise ValueError(f"delay_us must be non-negative, not {delay_us}")
        self._map[:8] = struct.pack(self._FORMAT, delay_us)

    def seconds(self) -> float:
        """The delay now, in seconds."""
        return struct.unpack(self._FORMAT, self._map[:8])[0] * 1e-6


class DelayingTransport(Transport):
    """``inner`` with every sent message held for ``delay_s()`` seconds (module docstring)."""

    def __init__(self, inner: Transport, delay_s: Callable[[], float], timeout_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self._timeout_s = timeout_s
        # The endpoints read these library facts from the instance; they are inner's.
        self.ordered_pairs = inner.ordered_pairs
        self.accepts_short_messages = inner.accepts_short_messages
        self._held: deque[tuple[float, torch.Tensor, int]] = deque()
        self._changed = threading.Condition()
        self._failure: TransferFailed | None = None
        self._stopped = False
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._run, name="afd-delay-link", daemon=True)
        self._thread.start()

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        """Take a copy of ``tensor`` for ``peer``; it goes on the wire ``delay_s`` later."""
        if not tensor.is_cpu:
            detail = "the delaying transport holds host tensors only"
            raise TransferFailed(peer, "interrupted", detail)
        release = time.monotonic() + self.delay_s()
        copy = tensor.clone()
        with self._changed:
            self._raise_failure()
            self._held.append((release, copy, peer))
            self._changed.notify()
        return Transfer(peer, _TAKEN)

    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        return self.inner.post_recv(tensor, peer)

    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        self.wait_all([transfer], deadline)

    def wait_all(self, transfers: list[Transfer], deadline: float | None) -> None:
        """Sends taken by this transport are complete; the rest are the wrapped one's."""
        with self._changed:
            self._raise_failure()
        received = [t for t in transfers if t.work is not _TAKEN]
        if received:
            self.inner.wait_all(received, deadline)

    def to_peer(self, peer: int, timeout_s: float) -> PeerTransport:
        return PeerTransport(self, peer, timeout_s)

    def synchronize(self, deadline: float) -> None:
        self.inner.synchronize(deadline)

    def interrupt(self) -> None:
        with self._changed:
            self._stopped = True
            if self._failure is None:
                self._failure = TransferFailed(None, "interrupted", "the transport was interrupted")
            self._changed.notify()
        self.inner.interrupt()

    def close(self) -> None:
        self.interrupt()
        self.inner.close()
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)

    def allocate(self, nbytes: int) -> torch.Tensor:
        return self.inner.allocate(nbytes)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return self.inner.to_device(host)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.inner.to_host(tensor)

    def _raise_failure(self) -> None:
        """Raise the failure that ended the link thread (call with ``_changed`` held)."""
        failure = self._failure
        if failure is not None:
            raise TransferFailed(failure.peer, failure.reason, failure.detail)

    def _run(self) -> None:
        """Post each held message at its release time, in order; stop at the first failure."""
        while True:
            with self._changed:
                while not self._stopped and (not self._held or self._held[0][0] > time.monotonic()):
                    wait = self._held[0][0] - time.monotonic() if self._held else None
                    self._changed.wait(wait)
                if self._stopped:
                    return
                _, copy, peer = self._held.popleft()
            try:
                transfer = self.inner.post_send(copy, peer)
                self.inner.wait(transfer, time.monotonic() + self._timeout_s)
            except TransferFailed as exc:
                with self._changed:
                    if self._failure is None:
                        self._failure = exc
                    self._stopped = True
                return
