"""``P2pProtocolConnector``: the P2P wire protocol over abstract transport primitives.

It implements everything that does not depend on the transport: the control plane
(fixed-size frames; the FFN side's :class:`~afd_core.connectors.p2p_control.ControlInbox`),
packing a header, hidden states and router logits into one message
(:mod:`~afd_core.connectors.p2p_buffers`), the sender-side checks that keep both sides'
message sizes equal, the receiver-side header checks, concatenating a block and
splitting the result back. The byte formats are in :mod:`afd_core.connectors.p2p_wire`;
``docs/wire-protocol.md`` describes the whole protocol. This module holds the shared
state and the transport contract; the roles' halves are mixins:
:mod:`~afd_core.connectors.p2p_attention`, :mod:`~afd_core.connectors.p2p_ffn` and, for
CUDA graph steps, :mod:`~afd_core.connectors.p2p_graph`.

A transport subclasses it and implements ``_post_send``, ``_post_recv``, ``_wait``,
``_initialize`` (ending with :meth:`_start_protocol`) and ``_close`` (calling
:meth:`_stop_protocol`); a device transport also overrides ``_allocate``, ``_read_bytes``
and ``_write_bytes``. Importing this module imports no torch.
"""

from __future__ import annotations

import ctypes
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from afd_core.connector import Connector, ControlPlane, FFNStep, WireSpec
from afd_core.connectors.p2p_attention import AttentionSideMixin
from afd_core.connectors.p2p_buffers import MessageBuffers, Slot
from afd_core.connectors.p2p_control import ControlInbox
from afd_core.connectors.p2p_ffn import BlockEntry, FFNSideMixin
from afd_core.connectors.p2p_graph import GraphStepsMixin
from afd_core.connectors.p2p_wire import (
    CONTROL_FRAME_BYTES,
    DTYPE_SIZES,
    HeaderPacker,
    describe_rank,
)
from afd_core.errors import (
    AFDConfigError,
    AFDError,
    AFDPeerError,
    AFDProtocolError,
    AFDShutdown,
)
from afd_core.metadata import ControlPayload

if TYPE_CHECKING:
    import torch

    from afd_core.config import AFDConfig

#: What a wait is for: a description, or ``(layer, step_id)`` of a data message.
Purpose = str | tuple[int, int]


def describe_purpose(what: Purpose) -> str:
    """``"layer 3 of step 17"`` for ``(3, 17)``; a string unchanged."""
    return what if isinstance(what, str) else f"layer {what[0]} of step {what[1]}"


class _P2pControlPlane(ControlPlane):
    """The control channel of a :class:`P2pProtocolConnector`."""

    def __init__(self, connector: P2pProtocolConnector) -> None:
        self._connector = connector

    def send_step(self, payload: ControlPayload) -> None:
        self._connector._send_step(payload)

    def recv_step(self) -> FFNStep | None:
        return self._connector._recv_step()


class P2pProtocolConnector(AttentionSideMixin, FFNSideMixin, GraphStepsMixin, Connector):
    """The P2P protocol over abstract transport primitives (see the module docstring).

    Threading: the data-plane methods and ``send_step`` are called from one thread;
    ``recv_step`` from one thread (the FFN loop); :meth:`close` from any thread.

    Every forward of an attention rank exchanges at every one of
    ``wire.num_exchange_layers`` layers and every stage: ``send_step`` refuses to start
    a step while the previous one is incomplete, since the FFN rank would misread it.

    Buffers are reused per (direction, peer, stage) and grow to the largest message
    seen. The tensors of an :class:`FFNLayerBatch` stay valid until the next
    ``recv_hidden`` of the same stage.
    """

    #: Attention side: post the reply's receive before the send (gloo). A transport whose
    #: p2p ops between two ranks run in posting order on one stream (NCCL) sets False:
    #: a receive posted first would block the send the FFN rank waits for.
    _recv_reply_first: ClassVar[bool] = True

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        super().__init__(config, role_rank, wire)
        for name in (wire.dtype, wire.router_logits_dtype):
            if name not in DTYPE_SIZES:
                raise AFDConfigError(
                    f"AFD wire: dtype {name!r} cannot travel on the wire; use one of "
                    f"{sorted(DTYPE_SIZES)} (--dtype of both roles)"
                )
        self._timeout_s = float(config.afd_process_group_timeout_s)
        self._control = _P2pControlPlane(self)
        self._headers = HeaderPacker(wire)
        self._torch: Any = None
        self._buffers: MessageBuffers | None = None
        self._slots: dict[tuple[object, ...], Slot] = {}
        # Attention side, per stage: (send, receive, receive slot, layer, step) in flight;
        # a graph step has (its sends, None, None, layer, step) (see p2p_graph).
        self._inflight: dict[int, tuple[Any, Any, Slot | None, int, int]] = {}
        self._failure: AFDError | None = None
        # Attention side: the FFN rank, what this rank announced, exchanges done and
        # expected, and whether the announced step is a CUDA graph step.
        self._announced: tuple[int, tuple[int, ...]] | None = None
        self._exchanges = 0
        self._expected_exchanges = 0
        self._graph_step = False
        self._control_frame: Any = None
        if config.role == "attention":
            self._ffn_rank = self.topology.ffn_rank_of(role_rank)
            self._ffn_world = self.topology.world_rank("ffn", self._ffn_rank)
        # FFN side: the control payloads of the block.
        block = self.topology.block_of(role_rank) if config.role == "ffn" else range(0)
        self._attention_world = {a: self.topology.world_rank("attention", a) for a in block}
        self._plans: dict[int, tuple[FFNStep, tuple[BlockEntry, ...]]] = {}
        self._inbox = ControlInbox(self, block)

    # Transport primitives ------------------------------------------------------------

    @abstractmethod
    def _post_send(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        """Start sending the uint8 tensor ``buf`` to world rank ``peer``; return a handle.

        ``buf`` must not change until :meth:`_wait` on the handle returned.
        """

    @abstractmethod
    def _post_recv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        """Start receiving exactly ``buf.numel()`` bytes from world rank ``peer``."""

    @abstractmethod
    def _wait(self, handle: Any, peer: int, deadline: float | None, what: Purpose) -> None:
        """Wait for ``handle`` until ``deadline`` (``time.monotonic()``; None: forever).

        Raise AFDShutdown when the connector was closed meanwhile, else AFDPeerError
        (built by :meth:`_peer_failure`).
        """

    def _allocate(self, nbytes: int) -> torch.Tensor:
        """A new uint8 buffer of ``nbytes`` that the transport sends from (CPU here)."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8)

    def _allocate_control(self, nbytes: int) -> torch.Tensor:
        """A new uint8 buffer for one control frame (default: :meth:`_allocate`)."""
        return self._allocate(nbytes)

    def _read_bytes(self, addr: int, nbytes: int) -> bytes:
        """``nbytes`` bytes at buffer address ``addr`` (CPU here)."""
        return ctypes.string_at(addr, nbytes)

    def _write_bytes(self, addr: int, data: bytes) -> None:
        """Write ``data`` at buffer address ``addr`` (CPU here)."""
        ctypes.memmove(addr, data, len(data))

    # Life cycle helpers for subclasses -------------------------------------------------

    def _start_protocol(self) -> None:
        """Call at the end of ``_initialize`` once the transport is up."""
        import torch

        self._buffers = MessageBuffers(self.wire, self._allocate)
        self._slots = self._buffers.slots
        self._dtype = self._buffers.dtype
        self._logits_dtype = self._buffers.logits_dtype
        self._torch = torch
        if self.config.role == "ffn":
            self._inbox.start()
        else:
            self._control_frame = self._allocate_control(CONTROL_FRAME_BYTES)

    def _stop_protocol(self, join_timeout_s: float = 2.0) -> None:
        """Call from ``_close`` once the transport woke its waiters."""
        self._inbox.stop(join_timeout_s)
        self._inflight.clear()
        self._plans.clear()
        self._control_frame = None
        if self._buffers is not None:
            self._buffers.clear()

    def _wake_waiters(self) -> None:
        self._inbox.wake()

    def _peer_failure(self, peer: int, what: Purpose, detail: str, timed_out: bool) -> AFDError:
        """The error for a failed wait on world rank ``peer`` (see :meth:`_wait`)."""
        doing = describe_purpose(what)
        if self.is_closed:
            return AFDShutdown(f"AFD: {self.name} was closed while waiting for {doing}")
        role, rank = self.topology.role_of_world_rank(peer)
        who = describe_rank(self.topology, role, rank)
        if timed_out:
            return AFDPeerError(
                f"AFD: {who} did not answer within {self._timeout_s:g} s ({doing}); it is "
                "stuck or overloaded, or the roles disagree on the step sequence "
                f"(afd_process_group_timeout_s sets this limit) [{detail}]"
            )
        return AFDPeerError(
            f"AFD: {who} closed the connection during {doing}; the "
            f"{'FFN' if role == 'ffn' else 'attention'} role stopped or crashed — see its "
            f"log [{detail}]"
        )

    # Shared helpers --------------------------------------------------------------------

    @property
    def control_plane(self) -> ControlPlane:
        return self._control

    def _raise_unusable(self) -> None:
        if self.is_closed:
            raise AFDShutdown(f"AFD: {self.name} is closed")
        if self._failure is not None:
            raise type(self._failure)(
                f"{self._failure} (this connector failed earlier; close it and start again)"
            )
        raise RuntimeError(f"{self.name}: call initialize() before exchanging data")

    def _fail(self, exc: AFDError) -> None:
        """Remember ``exc`` (unless it is AFDShutdown): later calls raise it again.

        Keeps a copy without traceback: the traceback's frames would hold transport
        handles, and through them the process group and its port, after close().
        """
        if not isinstance(exc, AFDShutdown):
            self._failure = type(exc)(str(exc))

    def _reject_rows(self, name: str, tensor: Any, rows: int, cols: int, dtype: Any) -> None:
        raise AFDProtocolError(
            f"AFD: {name} is {tuple(tensor.shape)} {tensor.dtype}, the header and wire spec "
            f"say ({rows}, {cols}) {dtype}"
        )
