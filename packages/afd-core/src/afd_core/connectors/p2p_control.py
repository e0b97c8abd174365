"""FFN side of the P2P control plane: receive control frames, assemble steps.

One daemon thread per attention rank of the block posts a receive of one control frame,
waits for it without a deadline (an idle attention role is normal), decodes it, queues
the payload and posts the next receive. :meth:`ControlInbox.next_step` waits until at
least one rank has a payload, takes one payload of every rank that has one at that
moment and assembles them into one :class:`~afd_core.connector.FFNStep`; a payload that
arrives later goes into a later step.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from afd_core.connectors.p2p_wire import (
    CONTROL_FRAME_BYTES,
    TAG_CONTROL,
    StepAssembler,
    decode_control_frame,
)
from afd_core.errors import AFDError, AFDShutdown

if TYPE_CHECKING:
    from afd_core.connector import FFNStep
    from afd_core.connectors.p2p_protocol import P2pProtocolConnector
    from afd_core.metadata import ControlPayload


class ControlInbox:
    """The control payloads reaching one FFN rank from the attention ranks of its block.

    ``connector`` supplies the transport primitives and the closed flag.
    """

    def __init__(self, connector: P2pProtocolConnector, block: range) -> None:
        self._connector = connector
        self._assembler = StepAssembler(block)
        self._cond = threading.Condition()
        self._queues: dict[int, deque[ControlPayload]] = {a: deque() for a in block}
        self._errors: dict[int, AFDError] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start one receiver thread per attention rank of the block."""
        for rank in self._queues:
            thread = threading.Thread(
                target=self._receive,
                args=(rank,),
                daemon=True,
                name=f"afd-control-a{rank}-f{self._connector.role_rank}",
            )
            self._threads.append(thread)
            thread.start()

    def wake(self) -> None:
        """Wake a thread waiting in :meth:`next_step` (it then checks the closed flag)."""
        with self._cond:
            self._cond.notify_all()

    def stop(self, join_timeout_s: float) -> None:
        """Join the receiver threads; call once the transport woke their waits."""
        self.wake()
        for thread in self._threads:
            thread.join(join_timeout_s)
        self._threads.clear()
        with self._cond:
            self._errors.clear()

    def ready_ranks(self) -> tuple[int, ...]:
        """Attention ranks that have a payload waiting, in block order."""
        with self._cond:
            return tuple(rank for rank, queue in self._queues.items() if queue)

    def next_step(self) -> FFNStep | None:
        """The next step of the block, or None once the connector is closed.

        Raises AFDPeerError when an attention rank with nothing queued has disconnected,
        AFDProtocolError for a payload that breaks the step rules.
        """
        connector = self._connector
        with self._cond:
            while True:
                if connector.is_closed:
                    return None
                ready = self._pop_ready()
                if ready:
                    break
                for error in self._errors.values():
                    if not isinstance(error, AFDShutdown):
                        raise error
                self._cond.wait(1.0)
        return self._assembler.assemble(ready)

    def _pop_ready(self) -> dict[int, ControlPayload]:
        """The first payload of every rank with one queued, all of one kind.

        A step is either a CUDA graph step (header-less data messages, see
        ``ControlPayload.is_graph_step``) or an eager one: the kind of the first ready
        rank in block order decides, ranks whose next payload is of the other kind wait
        for the next step. Call with ``_cond`` held.
        """
        kind: bool | None = None
        ready: dict[int, ControlPayload] = {}
        for rank, queue in self._queues.items():
            if not queue:
                continue
            if kind is None:
                kind = queue[0].is_graph_step
            if queue[0].is_graph_step == kind:
                ready[rank] = queue.popleft()
        return ready

    def _receive(self, rank: int) -> None:
        connector = self._connector
        peer = connector.topology.world_rank("attention", rank)
        frame = connector._allocate_control(CONTROL_FRAME_BYTES)
        addr = frame.data_ptr()
        try:
            while not connector.is_closed:
                handle = connector._post_recv(frame, peer, TAG_CONTROL)
                connector._wait(handle, peer, None, "the next control payload")
                payload = decode_control_frame(connector._read_bytes(addr, CONTROL_FRAME_BYTES))
                with self._cond:
                    self._queues[rank].append(payload)
                    self._cond.notify_all()
            return
        except AFDError as exc:
            error: AFDError = exc
        except Exception as exc:  # any transport failure ends this peer
            error = connector._peer_failure(peer, "the next control payload", str(exc), False)
        # Keep no traceback: its frames hold the transport handle (and so the group).
        error = type(error)(str(error))
        with self._cond:
            self._errors[rank] = error
            self._cond.notify_all()
