"""The transport contract: move tensors between two ranks of an AFD world.

A :class:`Transport` is one channel of an AFD world (a process group of its own): every
rank of the world holds one, identified by its world rank (FFN ranks first, see
:mod:`afd_core.topology`). It knows nothing of layers, steps or headers; the role
endpoints (:mod:`afd_core.runtime.p2p`, :mod:`afd_core.runtime.expert`) build their wire protocol on
these operations:

* :meth:`Transport.post_send` / :meth:`Transport.post_recv` start moving one contiguous
  tensor to or from a peer and return a :class:`Transfer` at once. The tensor must stay
  alive and unchanged until the transfer was waited for. Transfers between two ranks
  match in posting order (the n-th send of a rank to a peer lands in the peer's n-th
  receive from it).
* :meth:`Transport.wait` waits for one transfer until a deadline (``time.monotonic()``;
  None: no deadline). Afterwards the caller may use the tensor on its current stream.
  A host-memory transport (gloo) blocks the host until the data is there; a
  stream-ordered one (NCCL) only orders the caller's stream after the transfer and leaves
  the host free: :meth:`Transport.synchronize` then waits on the host, with a deadline,
  for everything posted so far.
* :meth:`Transport.to_peer` gives a :class:`PeerTransport`: the same posts and waits with one peer,
  for the endpoints' per-layer hot path, with what the transport needs about the peer
  (its tags, the wait limit in the library's form) worked out once.
* :meth:`Transport.interrupt` makes every blocked wait of this process raise
  :class:`TransferFailed` (``reason="interrupted"``) promptly; the transport is unusable
  afterwards. :meth:`Transport.close` interrupts and releases everything; both are
  idempotent and safe from any thread.

Failures raise :class:`TransferFailed` naming the peer and one of three reasons; the
endpoint turns it into an :class:`~afd_core.errors.AFDPeerError` (or
:class:`~afd_core.errors.AFDShutdown`) that says which layer and step it was waiting for.

A transport states in its module docstring the facts of its library that shape it (what
its library reports when a peer closes, in which order a pair's operations run).
afd-core implements the contract over gloo (:mod:`afd_core.runtime.gloo`);
afd-connectors-gpu over NCCL. Importing this module imports no torch.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    import torch

#: Why a transfer failed: its deadline passed, the peer closed the connection, or this
#: process interrupted (or closed) the transport.
FailureReason = Literal["timeout", "peer_closed", "interrupted"]


class TransferFailed(Exception):
    """A transfer did not complete; ``peer`` is the peer's world rank (None when the
    transport cannot tell, as after :meth:`Transport.synchronize` of several peers)."""

    def __init__(self, peer: int | None, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason} (world rank {peer}): {detail}")
        self.peer = peer
        self.reason: FailureReason = reason
        self.detail = detail


class Transfer:
    """A posted send or receive; pass it back to the transport that made it.

    ``work`` is the library's handle (a ``torch.distributed.Work``); ``peer`` the world
    rank on the other end.
    """

    __slots__ = ("peer", "work")

    def __init__(self, peer: int, work: object) -> None:
        self.peer = peer
        self.work = work


class Transport(ABC):
    """One channel between the ranks of an AFD world (see the module docstring).

    Class attributes describe what the endpoints may rely on:

    * ``ordered_pairs``: a pair's operations run strictly in posting order, sends and
      receives together (NCCL: a receive posted before a send to the same peer blocks
      that send), so an endpoint must post what its peer waits for first;
    * ``accepts_short_messages``: a receive may be posted larger than the message that
      fills it (gloo); False when sizes must match exactly (NCCL).
    """

    ordered_pairs: ClassVar[bool] = False
    accepts_short_messages: ClassVar[bool] = False

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where this transport's tensors live (it sends from and receives into them)."""

    @abstractmethod
    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        """Start sending the contiguous ``tensor`` to world rank ``peer``.

        Raises TransferFailed when the transport is closed or the peer is known gone.
        """

    @abstractmethod
    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        """Start receiving the next message of ``peer`` into the contiguous ``tensor``."""

    @abstractmethod
    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        """Wait for ``transfer`` until ``deadline`` (``time.monotonic()``; None: forever).

        Raises TransferFailed: ``"timeout"`` past the deadline, ``"peer_closed"`` when the
        peer went away, ``"interrupted"`` after :meth:`interrupt` or :meth:`close`.
        """

    def wait_all(self, transfers: list[Transfer], deadline: float | None) -> None:
        """:meth:`wait` for each of ``transfers``, in order (one call on the hot path)."""
        for transfer in transfers:
            self.wait(transfer, deadline)

    def to_peer(self, peer: int, timeout_s: float) -> PeerTransport:
        """A :class:`PeerTransport` to world rank ``peer`` whose waits end within ``timeout_s``.

        The default delegates every call to this transport; a transport may return a
        leaner peer transport of its own (with the same behaviour).
        """
        return PeerTransport(self, peer, timeout_s)

    def synchronize(self, deadline: float) -> None:
        """Block the host until every transfer posted so far is complete.

        A no-op for transports whose :meth:`wait` blocks the host until the data is there
        (the default); raises like :meth:`wait`.
        """
        return None

    @abstractmethod
    def interrupt(self) -> None:
        """Make every wait of this process end now with ``"interrupted"`` (idempotent)."""

    @abstractmethod
    def close(self) -> None:
        """Interrupt, then release every resource (idempotent, safe from any thread)."""

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A new uint8 tensor of ``nbytes`` on :attr:`device`."""
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        """``host`` (a CPU tensor) as a tensor on :attr:`device`, for sending.

        The copy is ordered on the current stream; ``host`` may be reused at once.
        The default (host-memory transports) returns ``host`` itself.
        """
        return host

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (on :attr:`device`) as a CPU tensor; synchronises for device memory."""
        return tensor


class PeerTransport:
    """Posts to and from one peer of a transport, and bounded waits for them.

    :meth:`post_send` and :meth:`post_recv` behave as the transport's with ``peer``;
    :meth:`wait_all` waits for transfers posted through it, either each within
    ``timeout_s`` of the moment its wait begins (no deadline given) or all until a
    deadline, and raises :class:`TransferFailed` as :meth:`Transport.wait` does. This
    default delegates to the transport; build peer transports with :meth:`Transport.to_peer`.
    """

    __slots__ = ("peer", "timeout_s", "transport")

    def __init__(self, transport: Transport, peer: int, timeout_s: float) -> None:
        self.transport = transport
        self.peer = peer
        self.timeout_s = timeout_s

    def post_send(self, tensor: torch.Tensor) -> Transfer:
        """Start sending the contiguous ``tensor`` to the peer."""
        return self.transport.post_send(tensor, self.peer)

    def post_recv(self, tensor: torch.Tensor) -> Transfer:
        """Start receiving the peer's next message into the contiguous ``tensor``."""
        return self.transport.post_recv(tensor, self.peer)

    def wait_all(self, transfers: list[Transfer], deadline: float | None = None) -> None:
        """Wait for each of ``transfers`` in order: until ``deadline``
        (``time.monotonic()``), or with no deadline each within ``timeout_s``."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        self.transport.wait_all(transfers, deadline)
