"""Step relays: FFN rank 0 forms every step; the other FFN ranks run the same steps.

With expert-routed connectors every FFN rank exchanges with every attention rank of a
step, layer by layer. If FFN ranks formed their steps independently (each from the
payloads it happens to hold), one could batch attention ranks 0 and 1 while another
serves rank 0 alone, and each would wait for a message the other's attention rank cannot
send yet: a deadlock. So the attention ranks send their payloads to FFN rank 0 only
(the *leader*), which forms each step from whatever is queued (as a P2P FFN rank does)
and forwards it, as one fixed-size step message, to every other FFN rank (the
*followers*) before serving it (:class:`LeadingRelay`). Every FFN rank then serves the
same sequence of steps (:class:`FollowingRelay`).

A step message names, per payload, the seat generation of the server that sent it
(:mod:`afd_core.runtime.seats`), so a follower knows which of its links the rows of that rank
travel on: its link of that generation; none, when it has already linked a later one
(the step's server has left, so its rows are empty here); and when it has not linked
that generation yet (a replacement whose link its acceptor is still opening), it waits
for it, bounded by the AFD timeout.

The leader's wait for payloads and a follower's wait for step messages have no deadline
(an idle attention role is normal) and end when the connector closes; forwarding a step
is bounded by the AFD timeout. Links added or lost reach both relays at step
boundaries only (:meth:`~afd_core.kit.peer_links.FFNLinks.settle`).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from afd_core.dataplane.transport import TransferFailed, Transport
from afd_core.errors import AFDError, AFDPeerError, AFDProtocolError
from afd_core.failures import Fuse, PeerFailures, guarded_until_closed
from afd_core.runtime.control.channel import ControlInbox, host_buffer
from afd_core.runtime.control.step_merger import StepMerger
from afd_core.wire import decode_step_message, encode_step_message, step_message_bytes

if TYPE_CHECKING:
    from afd_core.connector import FFNStep
    from afd_core.kit.peer_links import AttentionLink, FFNLinks
    from afd_core.wire.metadata import ControlPayload

#: FFN rank 0 leads; it is rank 0 of every group of FFN ranks (FFN ranks come first).
LEADER_RANK = 0
#: Seconds between two looks of an idle follower at its links (and the fuse).
FOLLOWER_POLL_S = 1.0


@dataclass(frozen=True)
class RelayedStep:
    """A step as one FFN rank serves it: ``links[i]`` carries the rows of
    ``step.attention_ranks[i]`` (None: that server has left and this FFN rank has
    already linked its successor, so the rank has no rows here)."""

    step: FFNStep
    links: tuple[AttentionLink | None, ...]


class StepSource(Protocol):
    """Where an FFN rank's steps come from: :class:`LeadingRelay` or :class:`FollowingRelay`."""

    def next_step(self) -> RelayedStep | None:
        """The next step this FFN rank serves, None once the connector is closed."""
        ...


class LeadingRelay:
    """FFN rank 0: the steps of its control inbox, each forwarded to the followers.

    ``transport`` reaches the followers (their ranks on it: ``followers``);
    ``num_attention_ranks`` sizes the step message.
    """

    def __init__(
        self,
        inbox: ControlInbox,
        links: FFNLinks,
        transport: Transport,
        followers: tuple[int, ...],
        num_attention_ranks: int,
        timeout_s: float,
        failures: PeerFailures,
    ) -> None:
        self._inbox = inbox
        self._links = links
        self._transport = transport
        self._followers = followers
        self._num_attention_ranks = num_attention_ranks
        self._timeout_s = timeout_s
        self._failures = failures
        self._buffer, self._addr = host_buffer(transport, step_message_bytes(num_attention_ranks))

    def next_step(self) -> RelayedStep | None:
        """The next step (None once the connector is closed), forwarded to the followers.

        Raises what the inbox raises, and AFDPeerError when a follower does not take
        the step message in time.
        """
        step = self._inbox.next_step()
        if step is None:
            return None
        links = tuple(self._links.get(rank) for rank in step.attention_ranks)
        if self._followers:
            self._forward(step, tuple(link.generation for link in links))
        return RelayedStep(step, links)

    def _forward(self, step: FFNStep, generations: tuple[int, ...]) -> None:
        data = encode_step_message(step.payloads, generations, self._num_attention_ranks)
        ctypes.memmove(self._addr, data, len(data))
        deadline = time.monotonic() + self._timeout_s
        try:
            transfers = [self._transport.post_send(self._buffer, f) for f in self._followers]
            self._transport.wait_all(transfers, deadline)
        except TransferFailed as exc:
            raise self._failures.error(exc, "forwarding a step to the other FFN ranks") from None


class FollowingRelay:
    """A follower FFN rank: the steps FFN rank 0 forwards (see the module docstring).

    A daemon thread receives step messages from ``transport``'s rank :data:`LEADER_RANK`
    and queues them; :meth:`next_step` takes one at a time and finds the link of every
    rank of it in ``links``.
    """

    def __init__(
        self,
        links: FFNLinks,
        transport: Transport,
        num_attention_ranks: int,
        timeout_s: float,
        fuse: Fuse,
        failures: PeerFailures,
        thread_name: str,
    ) -> None:
        self._links = links
        self._transport = transport
        self._num_attention_ranks = num_attention_ranks
        self._timeout_s = timeout_s
        self._fuse = fuse
        self._failures = failures
        self._merger = StepMerger(tuple(range(num_attention_ranks)))
        self._generations: dict[int, int] = {}
        self._cond = threading.Condition()
        self._steps: deque[tuple[tuple[ControlPayload, int], ...]] = deque()
        self._error: AFDError | None = None
        self._changed = False
        links.on_change(self._note_change)
        self._thread = threading.Thread(target=self._receive, name=thread_name, daemon=True)

    def start(self) -> None:
        """Start the receiver thread."""
        self._thread.start()

    def wake(self) -> None:
        """Wake a thread waiting in :meth:`next_step` (it then checks the fuse)."""
        with self._cond:
            self._cond.notify_all()

    def stop(self, join_timeout_s: float) -> None:
        """Join the receiver thread; call once the transport was interrupted."""
        self.wake()
        if self._thread.is_alive():
            self._thread.join(join_timeout_s)

    @guarded_until_closed
    def next_step(self) -> RelayedStep | None:
        """The next step FFN rank 0 forwarded (None once the connector is closed).

        Raises AFDPeerError when FFN rank 0 is gone or a replacement's link does not
        open within the AFD timeout, AFDProtocolError for a step message that breaks the rules.
        """
        while True:
            self._settle()
            with self._cond:
                if self._fuse.closed:
                    return None
                self._fuse.check_failure()  # e.g. another FFN rank was lost
                if self._steps:
                    entries = self._steps.popleft()
                    break
                if self._error is not None:
                    raise self._error
                self._fuse.check_departure()
                if not self._changed:
                    self._cond.wait(FOLLOWER_POLL_S)
        links = self._links_of(entries)
        for payload, generation in entries:
            if self._generations.get(payload.sender_rank) != generation:
                self._merger.forget(payload.sender_rank)  # a new server: ids start afresh
                self._generations[payload.sender_rank] = generation
        step = self._merger.merge({p.sender_rank: p for p, _ in entries})
        return RelayedStep(step, tuple(links[rank] for rank in step.attention_ranks))

    def _links_of(
        self, entries: tuple[tuple[ControlPayload, int], ...]
    ) -> dict[int, AttentionLink | None]:
        """The link of each entry's sender and generation (waits for one not yet open)."""
        deadline = time.monotonic() + self._timeout_s
        found: dict[int, AttentionLink | None] = {}
        for payload, generation in entries:
            rank = payload.sender_rank
            while True:
                link = self._links.current().get(rank)
                if link is not None and link.generation >= generation:
                    found[rank] = link if link.generation == generation else None
                    break
                if time.monotonic() >= deadline:
                    raise AFDPeerError(
                        f"AFD FFN rank {self._links.ffn_rank}: FFN rank 0 runs a step with "
                        f"generation {generation} of attention rank {rank}, but this FFN "
                        f"rank's link with that server did not open within "
                        f"{self._timeout_s:g} s; see that attention server's log"
                    )
                with self._cond:
                    if not self._changed:
                        self._cond.wait(min(FOLLOWER_POLL_S, max(0.0, deadline - time.monotonic())))
                self._settle()  # an older link goes, a new one comes
        return found

    def _settle(self) -> None:
        """Take in the links added and lost since the last look (FFN loop thread)."""
        with self._cond:
            self._changed = False
        self._links.settle(lambda link: None)

    def _note_change(self) -> None:
        with self._cond:
            self._changed = True
            self._cond.notify_all()

    def _receive(self) -> None:
        transport, size = self._transport, step_message_bytes(self._num_attention_ranks)
        buffer, addr = host_buffer(transport, size)
        try:
            while not self._fuse.closed:
                transport.wait(transport.post_recv(buffer, LEADER_RANK), None)
                entries = decode_step_message(
                    ctypes.string_at(addr, size), self._num_attention_ranks
                )
                with self._cond:
                    self._steps.append(entries)
                    self._cond.notify_all()
            return
        except TransferFailed as exc:
            if self._fuse.closed:
                return
            error: AFDError = self._failures.error(exc, "the next step from FFN rank 0")
        except AFDProtocolError as exc:
            error = exc
        with self._cond:
            self._error = type(error)(str(error))  # no traceback: it holds the transport
            self._cond.notify_all()
