"""ByteCountingTransport: a transport decorator that counts the bytes posted on it.

It implements the :class:`afd_core.dataplane.transport.Transport` contract by delegation: every
call goes to the wrapped transport, and the posts add the tensor's size to a
:class:`ByteCounts`. The endpoints post on the :meth:`Transport.to_peer` objects, so those
are wrapped too (around the wrapped transport's own peer transports, which keeps their speed).
The library facts the endpoints read (``ordered_pairs``, ``accepts_short_messages``)
are the wrapped transport's. Importing this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.dataplane.transport import PeerTransport, Transfer, Transport

if TYPE_CHECKING:
    import torch


@dataclass
class ByteCounts:
    """Bytes of the tensors posted on a data plane: ``sent`` by sends, ``received`` by
    receive buffers (a transport that accepts short messages may fill one only in part).

    Updated by the thread that posts (an endpoint is called from one thread).
    """

    sent: int = 0
    received: int = 0


class ByteCountingTransport(Transport):
    """``inner`` with every posted tensor counted in ``counts``."""

    def __init__(self, inner: Transport, counts: ByteCounts) -> None:
        self.inner = inner
        self.counts = counts
        # The endpoints read these library facts from the instance; they are inner's.
        self.ordered_pairs = inner.ordered_pairs
        self.accepts_short_messages = inner.accepts_short_messages

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        transfer = self.inner.post_send(tensor, peer)
        self.counts.sent += tensor.nbytes
        return transfer

    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        transfer = self.inner.post_recv(tensor, peer)
        self.counts.received += tensor.nbytes
        return transfer

    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        self.inner.wait(transfer, deadline)

    def wait_all(self, transfers: list[Transfer], deadline: float | None) -> None:
        self.inner.wait_all(transfers, deadline)

    def to_peer(self, peer: int, timeout_s: float) -> PeerTransport:
        return _CountingPeerTransport(self, self.inner.to_peer(peer, timeout_s))

    def synchronize(self, deadline: float) -> None:
        self.inner.synchronize(deadline)

    def interrupt(self) -> None:
        self.inner.interrupt()

    def close(self) -> None:
        self.inner.close()

    def allocate(self, nbytes: int) -> torch.Tensor:
        return self.inner.allocate(nbytes)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return self.inner.to_device(host)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.inner.to_host(tensor)


class _CountingPeerTransport(PeerTransport):
    """The wrapped transport's peer transport, with its posts counted."""

    __slots__ = ("counts", "inner")

    def __init__(self, transport: ByteCountingTransport, inner: PeerTransport) -> None:
        super().__init__(transport, inner.peer, inner.timeout_s)
        self.counts = transport.counts
        self.inner = inner

    def post_send(self, tensor: torch.Tensor) -> Transfer:
        transfer = self.inner.post_send(tensor)
        self.counts.sent += tensor.nbytes
        return transfer

    def post_recv(self, tensor: torch.Tensor) -> Transfer:
        transfer = self.inner.post_recv(tensor)
        self.counts.received += tensor.nbytes
        return transfer

    def wait_all(self, transfers: list[Transfer], deadline: float | None = None) -> None:
        self.inner.wait_all(transfers, deadline)
