"""Headed messages between world ranks over a transport: :class:`MessageChannel`.

A pattern, or a reference kernel that must behave like a device kernel, that moves
fixed-size headers and bodies between ranks keeps the same rules, written here once:

* every message is a header of a :class:`Header` type and bodies whose sizes the header
  (or what both sides know) gives: a receive is posted only once its size is known
  (gloo aborts the receiving process on a message larger than the receive);
* ``seq`` is the call number of this rank on this channel with that peer
  (:meth:`MessageChannel.next_call`; both sides count every call between them alike);
* sends stay pending until the next call with that peer finishes them
  (:meth:`MessageChannel.finish_sends`; the bodies the caller passes must stay unchanged
  until then);
* every wait ends by a deadline; a lost peer or that deadline raises AFDPeerError naming
  the peer and the call, :meth:`MessageChannel.interrupt` makes blocked and later calls
  raise AFDShutdown;
* a received header that differs from the expected one raises AFDProtocolError naming
  both views, the sender, and the owner's advice.

Users: afd-ascend-ops' reference kernels (the ``"AFDA"`` :class:`OpsHeader
<afd_ascend_ops.header.OpsHeader>`), and third-party patterns (the example plugin's
``afd_example_connector.kit_block``). A pattern's endpoint builds its channels on its
side's transport (:attr:`afd_core.kit.endpoint_context.EndpointContext.transport`) with
the connector's fuse: the connector's close then makes a woken wait AFDShutdown, and a
peer loss its peer watch found is the error a woken wait raises. The assembler
interrupts and releases that transport, so such an endpoint never closes its channels.
Not thread-safe: the owner calls it under its own lock (``interrupt`` and ``close`` may
run on any thread).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, Self, TypeVar

import torch

from afd_core.dataplane.transport import Transfer, TransferFailed
from afd_core.errors import AFDProtocolError
from afd_core.failures import Fuse, PeerFailures
from afd_core.topology import Topology

if TYPE_CHECKING:
    from typing import Self

    from afd_core.dataplane.transport import Transport


class Header(Protocol):
    """A fixed-size message header a :class:`MessageChannel` carries."""

    #: Bytes of the encoded header.
    SIZE: ClassVar[int]

    @property
    def op(self) -> str:
        """What the message is (errors name it: ``"a2e"``, ``"layer"``)."""
        ...

    @property
    def seq(self) -> int:
        """The sender's call number with the receiver on this channel."""
        ...

    @property
    def source(self) -> int:
        """The sender's world rank."""
        ...

    def encode(self) -> bytes:
        """The :attr:`SIZE`-byte wire form."""
        ...

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """Parse :attr:`SIZE` bytes; AFDProtocolError for anything malformed."""
        ...

    def differences(self, expected: Self, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """``"field: sent X, expected Y"`` for every field (not in ``ignore``) where this
        received header differs from ``expected``."""
        ...


H = TypeVar("H", bound=Header)


@dataclass
class _Pending:
    """Sends of one call to one peer, still in flight, and the tensors they read."""

    op: str
    seq: int
    transfers: list[Transfer]
    tensors: list[torch.Tensor]


class MessageChannel(Generic[H]):
    """Headed messages of one group (see the module docstring).

    ``owner`` names who uses the channel in errors (``"afd_ascend"``); ``header`` is the
    header type; ``transport`` spans the world (its ranks are world ranks);
    ``world_rank`` is this process's rank in it (``role`` and ``role_rank`` its place);
    ``topology`` the world's rank map; ``timeout_s`` the AFD timeout; ``mispaired`` the
    advice a mismatched header's error ends with; ``fuse`` the state its errors follow
    (a pattern's endpoint passes its connector's; None: a fuse of its own, for an owner
    that closes the channel itself). :meth:`close` closes the transport.
    """

    def __init__(
        self,
        owner: str,
        header: type[H],
        name: str,
        transport: Transport,
        world_rank: int,
        topology: Topology,
        timeout_s: float,
        mispaired: str,
        *,
        fuse: Fuse | None = None,
    ) -> None:
        self.owner = owner
        self.name = name
        self.world_rank = world_rank
        self.topology = topology
        self.timeout_s = timeout_s
        self.role, self.role_rank = topology.role_of_world_rank(world_rank)
        self.fuse = fuse if fuse is not None else Fuse(f"{owner} group {name!r}")
        self._header = header
        self._transport = transport
        self._failures = PeerFailures(topology, timeout_s, self.fuse)
        self._mispaired = mispaired
        self._calls: dict[int, int] = {}
        self._pending: dict[int, _Pending] = {}

    def interrupt(self) -> None:
        """Make a blocked wait raise AFDShutdown now, and every later call (idempotent)."""
        self.fuse.close()
        self._transport.interrupt()

    def close(self) -> None:
        """Interrupt and release the transport (idempotent)."""
        self.interrupt()
        self._transport.close()

    def close_under(self, lock: threading.Lock) -> None:
        """:meth:`close`, then forget the pending sends under the owner's ``lock``. A call
        woken by the interrupt returns at once; a lock still taken after ``timeout_s``
        means its thread is gone, and the pending sends go with the channel then."""
        self.close()
        if lock.acquire(timeout=self.timeout_s):
            try:
                self._pending.clear()
            finally:
                lock.release()

    def describe(self, world_rank: int) -> str:
        """``"attention rank 1 (world rank 3)"``."""
        return self._failures.describe(world_rank)

    def me(self) -> str:
        """This rank, described."""
        return self.describe(self.world_rank)

    def next_call(self, peer: int) -> int:
        """This call's number on this channel with ``peer`` (the header's ``seq``)."""
        seq = self._calls.get(peer, 0)
        self._calls[peer] = seq + 1
        return seq

    def send(self, peer: int, header: H, bodies: list[torch.Tensor]) -> None:
        """Post ``header`` and ``bodies`` to ``peer``; they stay pending until
        :meth:`finish_sends` of that peer."""
        head = torch.frombuffer(bytearray(header.encode()), dtype=torch.uint8)
        transfers = [self.post(peer, t, send=True) for t in (head, *bodies)]
        self._pending[peer] = _Pending(header.op, header.seq, transfers, [head, *bodies])

    def finish_sends(self, peer: int, deadline: float) -> None:
        """Wait until the previous call's sends to ``peer`` were received."""
        pending = self._pending.pop(peer, None)
        if pending is not None:
            doing = f"{pending.op} call {pending.seq} on group {self.name!r} to be received"
            for transfer in pending.transfers:
                self.wait(transfer, deadline, doing)

    def post(self, peer: int, tensor: torch.Tensor, *, send: bool) -> Transfer:
        """Post one send to or receive from ``peer``; AFDPeerError when that fails."""
        try:
            if send:
                return self._transport.post_send(tensor, peer)
            return self._transport.post_recv(tensor, peer)
        except TransferFailed as failure:
            error = self._failures.error(failure, f"a call on group {self.name!r}", peer)
        raise error

    def wait(self, transfer: Transfer, deadline: float | None, doing: str) -> None:
        """Wait for ``transfer`` until ``deadline`` (None: as long as it takes, for an idle
        receiver; a lost peer or :meth:`interrupt` still ends it)."""
        try:
            self._transport.wait(transfer, deadline)
            return
        except TransferFailed as failure:
            error = self._failures.error(failure, doing, transfer.peer)
        raise error

    def header_buffer(self) -> torch.Tensor:
        """A buffer to receive one header into."""
        return torch.empty(self._header.SIZE, dtype=torch.uint8)

    def decode(self, head: torch.Tensor, sender: int) -> H:
        """The header in ``head``; AFDProtocolError naming ``sender`` for a bad one."""
        raw = ctypes.string_at(head.data_ptr(), self._header.SIZE)
        try:
            return self._header.decode(raw)
        except AFDProtocolError as exc:
            raise AFDProtocolError(
                f"{exc} [sent by {self.describe(sender)} to {self.me()}]"
            ) from None

    def check(self, head: torch.Tensor, expected: H, *, ignore: tuple[str, ...] = ()) -> H:
        """The received header in ``head``; AFDProtocolError unless it is ``expected``."""
        return self.compare(self.decode(head, expected.source), expected, ignore=ignore)

    def compare(self, header: H, expected: H, *, ignore: tuple[str, ...] = ()) -> H:
        """``header``; AFDProtocolError naming both views unless it is ``expected``."""
        diffs = header.differences(expected, ignore=ignore)
        if diffs:
            raise AFDProtocolError(
                f"{self.owner}::{expected.op} on group {self.name!r}: the message "
                f"{self.describe(expected.source)} sent differs from what {self.me()} "
                f"expects: {'; '.join(diffs)}. {self._mispaired}"
            )
        return header
