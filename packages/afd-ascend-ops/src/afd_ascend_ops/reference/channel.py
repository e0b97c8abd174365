"""The message layer every reference group shares: headed messages to and from world ranks.

A :class:`MessageChannel` wraps one stage's transport over the whole AFD world (FFN ranks
first) and gives the reference kernels of both op families (``a2e``/``e2a`` in
:mod:`~afd_ascend_ops.reference.group`, the CAM async ops in
:mod:`~afd_ascend_ops.reference.async_group`) the same rules:

* every message is a :class:`~afd_ascend_ops.header.OpsHeader` and at most one body
  whose size the header gives (a receive is posted only once its size is known: gloo
  aborts the receiving process on a message larger than the receive);
* ``seq`` is the call number of this rank on this channel with that peer (both sides
  count every call between them alike, sends and receives);
* sends stay pending until the next call with that peer finishes them (the caller may
  change its tensors meanwhile: bodies are private copies);
* every wait ends by a deadline; a lost peer or that deadline raises AFDPeerError naming
  the peer and the call, :meth:`interrupt` makes blocked and later calls raise
  AFDShutdown, and after any AFD error the owner refuses further calls (``guarded``);
* a received header that differs from the expected one raises AFDProtocolError naming
  both views and the owner's advice.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from afd_ascend_ops.header import Op, OpsHeader
from afd_ascend_ops.reference.bodies import TORCH_DTYPES, WIRE_TORCH_DTYPES
from afd_core.dataplane.transport import Transfer, TransferFailed
from afd_core.errors import AFDProtocolError
from afd_core.failures import Fuse, PeerFailures
from afd_core.topology import Topology

if TYPE_CHECKING:
    from afd_core.dataplane.transport import Transport


@dataclass
class _Pending:
    """Sends of one call to one peer, still in flight, and the tensors they read."""

    op: Op
    seq: int
    transfers: list[Transfer]
    tensors: list[torch.Tensor]


class MessageChannel:
    """Headed messages of one group (see the module docstring).

    ``transport`` spans the world (its ranks are world ranks), ``world_rank`` is this
    process's rank in it (``role`` and ``role_rank`` its place), ``topology`` the world's
    rank map, ``timeout_s`` the AFD timeout; ``mispaired`` is the advice a mismatched
    header's error ends with. The channel owns the transport. Not thread-safe: the owner
    calls it under its own lock (``interrupt`` and ``close`` may run on any thread).
    """

    def __init__(
        self,
        name: str,
        transport: Transport,
        world_rank: int,
        topology: Topology,
        timeout_s: float,
        mispaired: str,
    ) -> None:
        self.name = name
        self.world_rank = world_rank
        self.topology = topology
        self.timeout_s = timeout_s
        self.role, self.role_rank = topology.role_of_world_rank(world_rank)
        self.fuse = Fuse(f"afd_ascend group {name!r}")
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

    def send(self, peer: int, header: OpsHeader, bodies: list[torch.Tensor]) -> None:
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

    def decode(self, head: torch.Tensor, sender: int) -> OpsHeader:
        """The header in ``head``; AFDProtocolError naming ``sender`` for a bad one."""
        raw = ctypes.string_at(head.data_ptr(), OpsHeader.SIZE)
        try:
            return OpsHeader.decode(raw)
        except AFDProtocolError as exc:
            raise AFDProtocolError(
                f"{exc} [sent by {self.describe(sender)} to {self.me()}]"
            ) from None

    def check(
        self, head: torch.Tensor, expected: OpsHeader, *, ignore: tuple[str, ...] = ()
    ) -> OpsHeader:
        """The received header in ``head``; AFDProtocolError unless it is ``expected``."""
        return self.compare(self.decode(head, expected.source), expected, ignore=ignore)

    def compare(
        self, header: OpsHeader, expected: OpsHeader, *, ignore: tuple[str, ...] = ()
    ) -> OpsHeader:
        """``header``; AFDProtocolError naming both views unless it is ``expected``."""
        diffs = header.differences(expected, ignore=ignore)
        if diffs:
            raise AFDProtocolError(
                f"afd_ascend::{expected.op} on group {self.name!r}: the message "
                f"{self.describe(expected.source)} sent differs from what {self.me()} "
                f"expects: {'; '.join(diffs)}. {self._mispaired}"
            )
        return header


def wire_dtype(op: str, group: str, name: str, tensor: torch.Tensor) -> str:
    """The wire name of ``tensor``'s dtype; ValueError for a tensor the CPU reference
    kernels cannot move."""
    dtype = WIRE_TORCH_DTYPES.get(tensor.dtype)
    if dtype is None or tensor.device.type != "cpu":
        raise ValueError(
            f"afd_ascend::{op} on group {group!r}: the CPU reference kernel moves CPU tensors "
            f"of {sorted(TORCH_DTYPES)}; {name} is {tensor.dtype} on {tensor.device}"
        )
    return dtype


def check_positive(op: str, name: str, value: int) -> None:
    """ValueError unless ``value`` is positive."""
    if value <= 0:
        raise ValueError(f"afd_ascend::{op}: {name} must be positive, not {value}")
