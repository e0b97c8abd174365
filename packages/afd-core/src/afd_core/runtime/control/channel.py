"""The control channel over a host-memory transport: one fixed-size message per step.

* :class:`ControlSender` (attention side): writes the step's
  :class:`~afd_core.wire.metadata.ControlPayload` into a control message and sends it to
  the FFN rank(s) that receive this rank's steps, waiting at most ``afd_process_group_timeout_s``.
* :class:`ControlInbox` (FFN side): one daemon thread per attention rank posts a receive
  of one control message, waits for it without a deadline (an idle attention role is normal),
  decodes it, queues the payload and posts the next receive. :meth:`ControlInbox.next_step`
  waits until at least one rank has a payload, takes one payload of every rank that has
  one at that moment and assembles them into one :class:`~afd_core.connector.FFNStep`;
  a payload that arrives later goes into a later step.

Control messages have a fixed size (:data:`~afd_core.wire.CONTROL_MESSAGE_BYTES`), so a receive is
always posted large enough. The channel's transport need not have a process group of its
own: on gloo the data plane shares it (the data transport is ``control.share(TAG_DATA)``,
:mod:`afd_core.runtime.world`) under another tag, so control and data messages still
never match each other's receives.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.dataplane.transport import TransferFailed, Transport
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.failures import Fuse, PeerFailures, guarded, guarded_until_closed
from afd_core.runtime.control.step_merger import StepMerger
from afd_core.wire import CONTROL_MESSAGE_BYTES, decode_control_message, encode_control_message

if TYPE_CHECKING:
    from afd_core.connector import FFNStep
    from afd_core.kit.peer_links import AttentionLink, FFNLinks
    from afd_core.wire.metadata import ControlPayload

#: What an inbox thread waits for, in error messages.
NEXT_PAYLOAD = "the next control payload"
#: Seconds the FFN loop waits for the receiver thread of a lost link to end.
LOST_RECEIVER_JOIN_S = 2.0


def host_buffer(transport: Transport, nbytes: int = CONTROL_MESSAGE_BYTES) -> tuple[object, int]:
    """A zeroed buffer of ``transport`` for a fixed-size message, and its address (host memory)."""
    buffer = transport.allocate(nbytes)
    buffer.zero_()
    if buffer.device.type != "cpu":
        raise ValueError("AFD control: the control channel needs a host-memory transport")
    return buffer, buffer.data_ptr()


class ControlSender:
    """Attention side: sends each step's payload to ``peers`` (FFN world ranks), in order."""

    def __init__(
        self,
        transport: Transport,
        peers: tuple[int, ...],
        timeout_s: float,
        fuse: Fuse,
        failures: PeerFailures,
    ) -> None:
        self._transport = transport
        self._peers = peers
        self._timeout_s = timeout_s
        self._fuse = fuse
        self._failures = failures
        self._buffer, self._addr = host_buffer(transport)

    @guarded
    def send(self, payload: ControlPayload) -> None:
        """Send ``payload``; returns once every peer received it (bounded by the timeout).

        Raises AFDProtocolError for a payload too large for a control message,
        AFDPeerError when a peer is gone or does not take the message in time.
        """
        data = encode_control_message(payload)
        ctypes.memmove(self._addr, data, len(data))
        deadline = time.monotonic() + self._timeout_s
        doing = f"the control payload of step {payload.step_id}"
        try:
            for peer in self._peers:
                self._transport.wait(self._transport.post_send(self._buffer, peer), deadline)
        except TransferFailed as exc:
            raise self._failures.error(exc, doing) from None


@dataclass(frozen=True)
class _Receiver:
    """The thread receiving one attention rank's control messages, and its link."""

    link: AttentionLink
    thread: threading.Thread


class ControlInbox:
    """FFN side: the control payloads of the attention ranks of ``links``.

    Links added or lost while it runs (replaceable links, :mod:`afd_core.runtime.links`) are
    taken in by :meth:`next_step`, between steps: a lost link's receiver thread is ended
    and its queued payloads dropped, a new link gets a receiver thread and its step ids
    start afresh.
    """

    def __init__(self, links: FFNLinks, fuse: Fuse, thread_name: str) -> None:
        self._links = links
        self._fuse = fuse
        self._thread_name = thread_name
        ranks = tuple(sorted(links.current()))
        self._merger = StepMerger(ranks)
        self._cond = threading.Condition()
        self._receivers: dict[int, _Receiver] = {}
        self._queues: dict[int, deque[ControlPayload]] = {a: deque() for a in ranks}
        self._errors: dict[int, AFDError] = {}
        self._changed = False
        links.on_change(self._note_change)

    def start(self) -> None:
        """Start one receiver thread per attention rank."""
        for link in self._links.current().values():
            self._start(link)

    def wake(self) -> None:
        """Wake a thread waiting in :meth:`next_step` (it then checks the fuse)."""
        with self._cond:
            self._cond.notify_all()

    def stop(self, join_timeout_s: float) -> None:
        """Join the receiver threads; call once the transports were interrupted."""
        self.wake()
        for receiver in self._receivers.values():
            receiver.thread.join(join_timeout_s)
        self._receivers.clear()

    def ready_ranks(self) -> tuple[int, ...]:
        """Attention ranks that have a payload waiting, in sender order."""
        with self._cond:
            return tuple(rank for rank, queue in self._queues.items() if queue)

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        """The next step, or None once the connector is closed.

        Raises AFDPeerError when an attention rank with nothing queued has disconnected
        or nothing is queued and a peer left (``Fuse.check_departure``), or when no
        attention rank was linked for the idle limit (replaceable links);
        AFDProtocolError for a payload that breaks the step rules.
        """
        while True:
            self._take_in_changes()
            with self._cond:
                if self._fuse.closed:
                    return None
                self._fuse.check_failure()  # e.g. another FFN rank was lost
                ready = self._pop_ready()
                if ready:
                    break
                for error in self._errors.values():
                    raise error
                self._fuse.check_departure()
                idle = self._links.idle_error()
                if idle is not None:
                    raise idle
                if not self._changed:
                    self._cond.wait(self._links.idle_wait_s())
        return self._merger.merge(ready)

    def _note_change(self) -> None:
        with self._cond:
            self._changed = True
            self._cond.notify_all()

    def _take_in_changes(self) -> None:
        """End the receivers of lost links, start those of new ones (FFN loop thread)."""
        with self._cond:
            self._changed = False
        added, _ = self._links.settle(self._end_receiver)
        for link in added:
            with self._cond:
                self._queues[link.rank] = deque()
                self._errors.pop(link.rank, None)
            self._merger.forget(link.rank)
            self._start(link)

    def _end_receiver(self, link: AttentionLink) -> None:
        with self._cond:
            receiver = self._receivers.pop(link.rank, None)
        if receiver is not None:
            receiver.thread.join(LOST_RECEIVER_JOIN_S)
        with self._cond:
            self._queues[link.rank].clear()
            self._errors.pop(link.rank, None)

    def _start(self, link: AttentionLink) -> None:
        thread = threading.Thread(
            target=self._receive,
            args=(link,),
            daemon=True,
            name=f"{self._thread_name}-a{link.rank}",
        )
        with self._cond:
            self._receivers[link.rank] = _Receiver(link, thread)
        thread.start()

    def _pop_ready(self) -> dict[int, ControlPayload]:
        """The first payload of every rank with one queued, all of one kind.

        A step is either a CUDA graph step (header-less data messages, see
        ``ControlPayload.is_graph_step``) or an eager one, and all its ranks run the same
        number of stages (each attention rank decides per step whether its batch splits):
        the kind of the first ready rank in sender order decides, ranks whose next payload
        is of another kind wait for the next step. Ranks whose link is lost take no part.
        Call with ``_cond`` held.
        """
        kind: tuple[bool, int] | None = None
        ready: dict[int, ControlPayload] = {}
        for rank, queue in self._queues.items():
            receiver = self._receivers.get(rank)
            if not queue or receiver is None or receiver.link.lost is not None:
                continue
            head = (queue[0].is_graph_step, len(queue[0].stages))
            if kind is None:
                kind = head
            if head == kind:
                ready[rank] = queue.popleft()
        return ready

    def _receive(self, link: AttentionLink) -> None:
        transport, peer = link.control, link.peer
        buffer, addr = host_buffer(transport)
        try:
            while not self._fuse.closed:
                transport.wait(transport.post_recv(buffer, peer), None)
                payload = decode_control_message(ctypes.string_at(addr, CONTROL_MESSAGE_BYTES))
                with self._cond:
                    self._queues[link.rank].append(payload)
                    self._cond.notify_all()
            return
        except TransferFailed as exc:
            error: AFDError = link.failures.error(exc, NEXT_PAYLOAD)
            if self._fuse.closed or self._links.lose(link, error):
                return
        except AFDProtocolError as exc:
            error = exc
        # Keep no traceback: its frames hold the transport handle (and so the group).
        error = type(error)(str(error))
        with self._cond:
            self._errors[link.rank] = error
            self._cond.notify_all()
