"""``StepRelay``: FFN rank 0 forms every step; the other FFN ranks run the same steps.

With expert-routed connectors every FFN rank exchanges with every attention rank of a
step, layer by layer. If FFN ranks formed their steps independently (each from the
payloads it happens to hold), one could batch attention ranks 0 and 1 while another
serves rank 0 alone, and each would wait for a message the other's attention rank cannot
send yet: a deadlock. So the attention ranks send their payloads to FFN rank 0 only
(the *leader*), which forms each step from whatever is queued (as a P2P FFN rank does)
and forwards it, as one fixed-size step frame, to every other FFN rank (the
*followers*) before serving it. Every FFN rank then serves the same sequence of steps.

The leader's wait for payloads and a follower's wait for step frames have no deadline
(an idle attention role is normal) and end when the connector closes; forwarding a step
is bounded by the AFD timeout.
"""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING

from afd_core.control.assembler import StepAssembler
from afd_core.control.channel import ControlInbox, host_frame
from afd_core.failures import Fuse, PeerFailures, guarded_until_closed
from afd_core.transport import TransferFailed, Transport
from afd_core.wire import decode_step_frame, encode_step_frame, step_frame_bytes

if TYPE_CHECKING:
    from afd_core.connector import FFNStep

#: FFN rank 0 is world rank 0 (FFN ranks come first).
LEADER_WORLD_RANK = 0


class StepRelay:
    """The steps of one FFN rank of an expert-routed world (see the module docstring).

    On the leader ``inbox`` is its control inbox (payloads of every attention rank) and
    ``followers`` the world ranks of the other FFN ranks; on a follower ``inbox`` is None.
    """

    def __init__(
        self,
        transport: Transport,
        num_attention_ranks: int,
        inbox: ControlInbox | None,
        followers: tuple[int, ...],
        timeout_s: float,
        fuse: Fuse,
        failures: PeerFailures,
    ) -> None:
        self._transport = transport
        self._num_attention_ranks = num_attention_ranks
        self._inbox = inbox
        self._followers = followers
        self._timeout_s = timeout_s
        self._fuse = fuse
        self._failures = failures
        self._assembler = StepAssembler(tuple(range(num_attention_ranks)))
        self._frame, self._addr = host_frame(transport, step_frame_bytes(num_attention_ranks))

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        """The next step this FFN rank serves (None once the connector is closed).

        Raises AFDPeerError when the leader (or, on the leader, a follower or an
        attention rank) is gone, AFDProtocolError for a step that breaks the rules.
        """
        if self._inbox is None:
            return self._receive()
        step = self._inbox.next_step()
        if step is not None:
            self._forward(step)
        return step

    def _forward(self, step: FFNStep) -> None:
        data = encode_step_frame(step.payloads, self._num_attention_ranks)
        ctypes.memmove(self._addr, data, len(data))
        deadline = time.monotonic() + self._timeout_s
        try:
            transfers = [self._transport.post_send(self._frame, f) for f in self._followers]
            self._transport.wait_all(transfers, deadline)
        except TransferFailed as exc:
            raise self._failures.error(exc, "forwarding a step to the other FFN ranks") from None

    def _receive(self) -> FFNStep:
        transport = self._transport
        try:
            transport.wait(transport.post_recv(self._frame, LEADER_WORLD_RANK), None)
        except TransferFailed as exc:
            raise self._failures.error(exc, "the next step from FFN rank 0") from None
        size = step_frame_bytes(self._num_attention_ranks)
        payloads = decode_step_frame(ctypes.string_at(self._addr, size), self._num_attention_ranks)
        return self._assembler.assemble({p.sender_rank: p for p in payloads})
