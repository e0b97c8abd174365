"""``GlooTransport``: the transport contract over a dedicated ``ProcessGroupGloo`` (CPU tensors).

One gloo group per transport, created directly on a ``PrefixStore`` of the rendezvous
session (never torch's default group). Facts of gloo in torch 2.13 that shape it
(observed; ``docs/wire-protocol.md`` section 5):

* a send/recv ``Work`` reports ``is_completed()`` only after ``wait()`` returned, so
  completion cannot be polled: a wait blocks in ``wait(timeout)`` (the GIL is released
  meanwhile), with the time left to the deadline;
* a wait that times out closes every pair of the group ("Application timeout caused
  pair closure"); ``abort()`` and ``shutdown()`` do not wake a blocked wait, but that
  pair closure does, within milliseconds. :meth:`GlooTransport.interrupt` therefore
  posts a dummy receive on a spare tag and lets it time out after 1 ms;
* a peer that dies wakes pending waits with "Connection closed by peer", in most runs
  at once: a send posted just as its peer closes has been seen to learn of it only at
  its own timeout;
* a message shorter than the posted receive fills the beginning of the buffer; a longer
  one aborts the receiving process (a C++ ``terminate``), so every receive is posted at
  least as large as the message it may get;
* a send completes once the peer has posted the matching receive: pre-posting receives
  saves a handshake;
* a receive and a send pending on one pair under the same tag are slower than under two
  tags (``docs/performance.md``).

Messages of one transport and direction use one tag (the transport's tag, with
:data:`TAG_UPWARD` set for messages from a higher to a lower world rank), so a pair's
messages match in posting order and the two directions never share a tag; a
second transport may share the group under another tag (:meth:`GlooTransport.share`),
which is how the reference connector runs its control channel and data plane on one
group: a second group doubles the gloo I/O threads and TCP connections of every rank,
and on a 2-core host their wake-ups cost more than the messages themselves
(``docs/performance.md``).
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

from afd_core.dataplane.transport import PeerTransport, Transfer, TransferFailed, Transport

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroupGloo, Store

    from afd_core.assembly import TransportSite

#: Tags of the two channels that can share one group (non-negative int32, far from the
#: small tags collectives use).
TAG_CONTROL = 0x41460001
TAG_DATA = 0x41460002
#: Set in the tag of a message from a higher to a lower world rank (see the module docstring).
TAG_UPWARD = 0x100
#: The tag of the dummy receive that :meth:`GlooTransport.interrupt` lets time out.
TAG_WAKE = 0x414600FF
#: How long a wait without deadline may block: "forever" without overflowing gloo's clock.
FOREVER = timedelta(days=3650)
_MIN_WAIT = timedelta(milliseconds=1)


class GlooTransport(Transport):
    """The transport contract over one gloo group; build it with :meth:`open`."""

    ordered_pairs: ClassVar[bool] = False
    accepts_short_messages: ClassVar[bool] = True

    def __init__(
        self, group: ProcessGroupGloo, world_rank: int, world_size: int, tag: int = TAG_CONTROL
    ) -> None:
        import torch

        self._group: ProcessGroupGloo | None = group
        self._world_rank = world_rank
        self._world_size = world_size
        self._tag = tag
        self._device = torch.device("cpu")
        self._interrupted = False
        self._sharers: list[GlooTransport] = []

    @classmethod
    def open(
        cls, store: Store, world_rank: int, world_size: int, timeout_s: float
    ) -> GlooTransport:
        """Create the gloo group of ``world_size`` ranks on ``store`` (blocks until all join).

        ``timeout_s`` bounds the group's creation; RuntimeError when a rank does not come.
        """
        import torch.distributed as dist

        group = dist.ProcessGroupGloo(store, world_rank, world_size, timedelta(seconds=timeout_s))
        return cls(group, world_rank, world_size)

    def share(self, tag: int) -> GlooTransport:
        """A second channel on this transport's group, with its own tag (its own message
        stream). Interrupting or closing either interrupts both: gloo closes every pair
        of the group; the group itself goes when the first one is closed."""
        assert self._group is not None
        other = GlooTransport(self._group, self._world_rank, self._world_size, tag)
        other._sharers.append(self)
        self._sharers.append(other)
        return other

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def group(self) -> ProcessGroupGloo:
        """The gloo group this transport posts on (shared by :meth:`share`), for measuring
        against raw gloo on the same group (``benchmarks/gloo_roundtrip.py``); RuntimeError
        once closed."""
        if self._group is None:
            raise RuntimeError("the gloo transport is closed")
        return self._group

    # Failures are raised outside the ``except`` blocks, from text only: an exception
    # chained to gloo's would keep its traceback's frames, and through them the pending
    # Work, the group and the rendezvous store, alive after close().

    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        return self._post(True, tensor, peer)

    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        return self._post(False, tensor, peer)

    def _post(self, send: bool, tensor: torch.Tensor, peer: int) -> Transfer:
        group = self._group
        if group is None or self._interrupted:
            raise TransferFailed(peer, "interrupted", "the transport is closed")
        upward = (self._world_rank > peer) if send else (peer > self._world_rank)
        tag = self._tag | TAG_UPWARD if upward else self._tag
        try:
            post = group.send if send else group.recv
            return Transfer(peer, post([tensor], peer, tag))
        except RuntimeError as exc:
            detail = str(exc)
        raise self._failure(peer, detail)

    def to_peer(self, peer: int, timeout_s: float) -> GlooPeerTransport:
        return GlooPeerTransport(self, peer, timeout_s)

    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        self.wait_all([transfer], deadline)

    def wait_all(
        self, transfers: list[Transfer], deadline: float | None, each: timedelta | None = None
    ) -> None:
        """The contract's ``wait_all``; ``each``, when given, bounds every wait on its own
        instead of ``deadline`` (how a :class:`GlooPeerTransport` waits)."""
        for transfer in transfers:
            timeout = each
            if timeout is None:
                timeout = FOREVER
                if deadline is not None:
                    timeout = max(timedelta(seconds=deadline - time.monotonic()), _MIN_WAIT)
            try:
                transfer.work.wait(timeout)  # type: ignore[attr-defined]
                continue
            except RuntimeError as exc:
                detail = str(exc)
            failure = self._failure(transfer.peer, detail)
            if failure.reason == "timeout" and deadline is None and each is None:
                failure = TransferFailed(transfer.peer, "interrupted", failure.detail)
            del transfers, transfer  # see above: the traceback must not hold the Work
            raise failure

    def interrupt(self) -> None:
        """Close every pair of the group by timing out a dummy receive (gloo has no cancel)."""
        group = self._group
        if group is None or self._interrupted:
            return
        self._interrupted = True
        for other in self._sharers:
            other._interrupted = True
        import torch

        peer = (self._world_rank + 1) % self._world_size
        # The intended timeout (gloo then closes every pair), or the pairs are closed.
        with contextlib.suppress(RuntimeError):
            group.recv([torch.empty(1, dtype=torch.uint8)], peer, TAG_WAKE).wait(_MIN_WAIT)

    def close(self) -> None:
        self.interrupt()
        group, self._group = self._group, None
        for other in self._sharers:
            other._group = None
            other._sharers.clear()
        self._sharers.clear()
        if group is not None:
            with contextlib.suppress(RuntimeError):  # pairs already closed: nothing to do
                group.shutdown()

    def _failure(self, peer: int, message: str) -> TransferFailed:
        """The TransferFailed for a gloo error message (its first line is the useful part)."""
        detail = message.split("\n", 1)[0]
        if self._interrupted:
            return TransferFailed(peer, "interrupted", detail)
        if "Timed out" in detail:
            return TransferFailed(peer, "timeout", detail)
        return TransferFailed(peer, "peer_closed", detail)


class GlooPeerTransport(PeerTransport):
    """:class:`~afd_core.dataplane.transport.PeerTransport` over a :class:`GlooTransport`:
    one call into gloo per post and per wait, with the peer's two tags and the wait limit
    (a ``timedelta``) worked out once. Each wait without a deadline is bounded by
    ``timeout_s`` on its own: a gloo wait that times out closes every pair of the group,
    so the waits after it fail at once. Posts after the transport was interrupted or
    closed raise "interrupted" (a peer transport may be made of a closed transport: a lost
    link's)."""

    __slots__ = ("_gloo", "_group", "_recv_tag", "_send_tag", "_timeout")

    def __init__(self, transport: GlooTransport, peer: int, timeout_s: float) -> None:
        super().__init__(transport, peer, timeout_s)
        self._gloo = transport
        self._group = transport._group  # None once closed: posts then raise first
        upward = transport._tag | TAG_UPWARD
        higher = transport._world_rank > peer
        self._send_tag = upward if higher else transport._tag
        self._recv_tag = transport._tag if higher else upward
        self._timeout = timedelta(seconds=timeout_s)

    def post_send(self, tensor: torch.Tensor) -> Transfer:
        if self._gloo._interrupted:
            raise TransferFailed(self.peer, "interrupted", "the transport is closed")
        try:
            return Transfer(self.peer, self._group.send([tensor], self.peer, self._send_tag))
        except RuntimeError as exc:
            detail = str(exc)
        raise self._gloo._failure(self.peer, detail)

    def post_recv(self, tensor: torch.Tensor) -> Transfer:
        if self._gloo._interrupted:
            raise TransferFailed(self.peer, "interrupted", "the transport is closed")
        try:
            return Transfer(self.peer, self._group.recv([tensor], self.peer, self._recv_tag))
        except RuntimeError as exc:
            detail = str(exc)
        raise self._gloo._failure(self.peer, detail)

    def wait_all(self, transfers: list[Transfer], deadline: float | None = None) -> None:
        self._gloo.wait_all(transfers, deadline, None if deadline is not None else self._timeout)


def shared_data_transport(site: TransportSite) -> Transport:
    """A gloo data plane: the world's control group under :data:`TAG_DATA` (see
    :func:`afd_core.assembly.gloo_data_plane`)."""
    control = site.control
    if not isinstance(control, GlooTransport):
        raise TypeError(f"a gloo data plane shares a gloo control group, not {type(control)}")
    return control.share(TAG_DATA)
