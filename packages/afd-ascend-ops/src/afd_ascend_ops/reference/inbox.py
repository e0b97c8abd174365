"""Whole messages from several peers, in the order they arrive: :class:`Inbox`.

A receiver without a control plane cannot know which peer sends next. gloo's
``recv_anysource`` would say, but a receive from any source is not woken when the group's
pairs close (measured on torch 2.13: neither an interrupt nor a peer that exits ends its
wait), so an idle receiver could never be shut down. An :class:`Inbox` instead runs one
reader thread per peer (``<name>-from-<rank>``); each posts a receive for that peer's
next header, which pair closure does wake, then the body the header announces (sized
from the header, so no message is larger than its receive), and queues the whole
message. :meth:`Inbox.take` returns the oldest one.

A reader that fails (the peer is gone, the transport was interrupted) queues its error
and stops; :meth:`Inbox.take` raises the first error once the messages before it were
taken. :meth:`Inbox.close` stops the readers: it interrupts the channel, so their waits
end, and joins them (bounded).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from afd_ascend_ops.header import OpsHeader
from afd_core.errors import AFDShutdown

if TYPE_CHECKING:
    from afd_core.kit.channel import MessageChannel

#: Seconds :meth:`Inbox.close` waits for each reader thread.
JOIN_TIMEOUT_S = 2.0


class Inbox:
    """Messages of ``peers`` (world ranks) on ``channel``, in arrival order.

    ``body_bytes(header)`` is the size of the body that follows ``header`` (0: none);
    ``doing`` names the idle wait in errors (``"the next dispatch on group 'g'"``).
    """

    def __init__(
        self,
        channel: MessageChannel[OpsHeader],
        peers: tuple[int, ...],
        body_bytes: Callable[[OpsHeader], int],
        doing: str,
    ) -> None:
        self._channel = channel
        self._body_bytes = body_bytes
        self._doing = doing
        self._cond = threading.Condition()
        self._messages: deque[tuple[int, OpsHeader, torch.Tensor]] = deque()
        self._error: BaseException | None = None
        self._closed = False
        self._readers = [
            threading.Thread(
                target=self._read, args=(peer,), name=f"{channel.name}-from-{peer}", daemon=True
            )
            for peer in peers
        ]
        for reader in self._readers:
            reader.start()

    def take(self) -> tuple[int, OpsHeader, torch.Tensor]:
        """The oldest message: (sender, header, body bytes). Waits as long as no peer
        sends; raises a reader's error (AFDPeerError for a lost peer), AFDShutdown once
        closed."""
        with self._cond:
            while not self._messages and self._error is None and not self._closed:
                self._cond.wait()
            if self._messages:
                return self._messages.popleft()
            if self._error is not None:
                raise self._error
            raise AFDShutdown(f"afd_ascend: the group {self._channel.name!r} was closed")

    def close(self) -> None:
        """Interrupt the channel, wake :meth:`take` and join the readers (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._channel.interrupt()
        for reader in self._readers:
            reader.join(JOIN_TIMEOUT_S)

    def _read(self, peer: int) -> None:
        channel = self._channel
        try:
            while not self._closed:
                head = torch.empty(OpsHeader.SIZE, dtype=torch.uint8)
                channel.wait(channel.post(peer, head, send=False), None, self._doing)
                header = channel.decode(head, peer)
                body = torch.empty(self._body_bytes(header), dtype=torch.uint8)
                if body.numel():
                    deadline = time.monotonic() + channel.timeout_s
                    what = (
                        f"the body of {header.op} call {header.seq} from {channel.describe(peer)}"
                    )
                    channel.wait(channel.post(peer, body, send=False), deadline, what)
                with self._cond:
                    self._messages.append((peer, header, body))
                    self._cond.notify_all()
        except BaseException as exc:  # raised by take()
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()
