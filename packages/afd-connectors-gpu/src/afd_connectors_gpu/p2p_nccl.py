"""``P2pNcclAFDConnector``: the P2P protocol with its data plane on NCCL (CUDA tensors).

Everything but the data plane is the gloo connector's: the rendezvous of
:mod:`afd_core.rendezvous`, the dedicated gloo group and its control plane (fixed-size
control frames, the FFN side's receiver threads, waking waiters on close). The data
messages (tags ``TAG_A2F`` and ``TAG_F2A``) travel on a ``ProcessGroupNCCL`` of their own,
built on a PrefixStore (``nccl/``) of the same session store: never vLLM's groups, so
AFD transfers are never serialised behind vLLM's collectives.

Transport facts that shape the primitives:

* torch runs every p2p op between two ranks on one NCCL communicator and stream, in
  posting order. The attention side therefore sends before it posts the reply's receive
  (``_recv_reply_first = False``); posted first, the receive would block the send the
  FFN rank waits for.
* Message buffers are tensors on the current CUDA device at ``initialize()`` (the
  worker's device inside vLLM; ``connector_extra_config`` is shared by both roles, so it
  cannot name a device), allocated once per (direction, peer, stage) and grown to the
  largest message: NCCL always receives into the same stable memory.
* A wait polls the op's CUDA event from the host until it completes, the deadline
  (``afd_process_group_timeout_s``) passes or the connector is closed, then makes the
  caller's current stream wait for NCCL's. :meth:`close` aborts the NCCL group, which
  ends pending ops.
* Control frames live in host memory: gloo sends them, also while a graph is captured.

Eager steps check every received header on the host (one device-to-host synchronisation
per layer) and write every header from pinned host memory. CUDA graph steps
(:mod:`afd_core.connectors.p2p_graph`) send bare tensors: while the current stream is
capturing, a wait only joins NCCL's stream (no polling), so the attention rank's
exchanges and the FFN rank's step are captured whole. Waits on the host stay bounded:
the FFN rank waits for its replays through :meth:`wait_for_stream`; the attention rank
does not wait for its replays, a :class:`~afd_connectors_gpu.replay_watch.ReplayWatch`
aborts the transfers of one that overruns the timeout.

``NCCL_GRAPH_MIXING_SUPPORT`` defaults to 0 in this process (a graph of many p2p ops is
about 4x faster when it is 0, measured on two H200s: docs/cuda.md). That is only
safe when captured and uncaptured ops of one communicator are never in flight together,
which this connector keeps: every eager op is waited for before the next step, and an
eager step first waits for the replays still running. Importing this module imports no
torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from afd_connectors_gpu.replay_watch import ReplayWatch
from afd_core.coercion import to_bool
from afd_core.connectors.gloo import P2pGlooAFDConnector
from afd_core.connectors.p2p_protocol import Purpose
from afd_core.connectors.p2p_wire import CONTROL_FRAME_BYTES, TAG_A2F, TAG_CONTROL, TAG_F2A
from afd_core.errors import AFDConfigError, AFDPeerError, AFDShutdown
from afd_core.metadata import ControlPayload

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds :meth:`P2pNcclAFDConnector._abort_transfers` waits for torch's abort.
ABORT_WAIT_S = 5.0

#: NCCL's own watchdog limit exceeds ours by this much, so a stuck peer surfaces as the
#: connector's AFDPeerError rather than as the watchdog ending the process.
_WATCHDOG_MARGIN_S = 60.0


@dataclass(frozen=True)
class NcclExtraConfig:
    """``connector_extra_config`` of :class:`P2pNcclAFDConnector`.

    ``high_priority_stream``: run NCCL's ops on a high-priority CUDA stream.
    """

    high_priority_stream: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> NcclExtraConfig:
        """Parse ``raw`` strictly; AFDConfigError naming any unknown or invalid field."""
        unknown = sorted(set(raw) - {"high_priority_stream"})
        if unknown:
            raise AFDConfigError(
                f"AFD config: connector_extra_config has unknown fields {unknown} for "
                "P2pNcclAFDConnector; it accepts only high_priority_stream (each rank uses "
                "its current CUDA device)"
            )
        return cls(
            to_bool(
                "connector_extra_config.high_priority_stream",
                raw.get("high_priority_stream", False),
            )
        )


#: NCCL setting for graphs of many p2p ops, applied unless the environment sets it.
GRAPH_MIXING_ENV = "NCCL_GRAPH_MIXING_SUPPORT"


class _ControlWork:
    """A control-plane (gloo) transfer, waited for by the gloo connector's ``_wait``."""

    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        self.work = work


class P2pNcclAFDConnector(P2pGlooAFDConnector):
    """AFD connector: gloo control plane, NCCL data plane (see the module docstring).

    ``connector_extra_config``: see :class:`NcclExtraConfig`. World order and
    rendezvous are the gloo connector's (FFN rank 0 hosts the store at
    ``config.host:config.port``). Each rank uses one CUDA device; two ranks cannot share
    one (NCCL refuses "Duplicate GPU").
    """

    name = "P2pNcclAFDConnector"
    _recv_reply_first: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._nccl: Any = None
        self._device: Any = None
        # Device buffers by address (weak: a buffer replaced by a larger one goes away).
        self._device_buffers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._write_stage: Any = None
        self._write_done: Any = None
        self._control_frames: dict[int, Any] = {}
        self._replays: ReplayWatch | None = None

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> NcclExtraConfig:
        """Accept ``high_priority_stream`` (see :class:`NcclExtraConfig`)."""
        return NcclExtraConfig.parse(raw)

    # Life cycle ------------------------------------------------------------------------

    def _start_protocol(self) -> None:
        """Bring up the NCCL data plane, then the protocol (end of the gloo ``_open``)."""
        import torch
        import torch.distributed as dist

        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise AFDConfigError(
                f"AFD: {self.name} needs CUDA and torch.distributed's NCCL backend; this "
                "torch has none: use P2pGlooAFDConnector"
            )
        self._torch = torch
        self._device = torch.device("cuda", torch.cuda.current_device())
        os.environ.setdefault(GRAPH_MIXING_ENV, "0")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=self._timeout_s + _WATCHDOG_MARGIN_S)
        options.is_high_priority_stream = self.extra.high_priority_stream
        try:
            self._nccl = dist.ProcessGroupNCCL(
                self._session.prefix_store("nccl"),
                self.world_rank,
                self.topology.world_size,
                options,
            )
        except RuntimeError as exc:
            raise AFDPeerError(
                f"AFD: creating the NCCL group of {self.topology.world_size} ranks at "
                f"{self._session.address} failed ({exc}); see the logs of the other ranks"
            ) from exc
        self._write_stage = torch.empty(CONTROL_FRAME_BYTES, dtype=torch.uint8, pin_memory=True)
        self._warm_up(torch)
        super()._start_protocol()

    def _warm_up(self, torch: Any) -> None:
        """Create the NCCL communicator of every data peer pair now, one byte each way.

        NCCL builds a pair's communicator at its first op, which blocks both ranks until
        the other arrives: done here, bounded by the timeout, rather than in a step.
        """
        deadline = time.monotonic() + self._timeout_s
        byte = torch.zeros(1, dtype=torch.uint8, device=self._device)
        peers = self.topology.peers_of(self.config.role, self.role_rank)
        for peer in peers:
            if self.config.role == "ffn":
                self._wait(self._post_recv(byte, peer, TAG_A2F), peer, deadline, "NCCL set-up")
                self._wait(self._post_send(byte, peer, TAG_F2A), peer, deadline, "NCCL set-up")
            else:
                self._wait(self._post_send(byte, peer, TAG_A2F), peer, deadline, "NCCL set-up")
                self._wait(self._post_recv(byte, peer, TAG_F2A), peer, deadline, "NCCL set-up")

    def _close(self) -> None:
        if self._replays is not None:
            self._replays.stop()
        self._abort_transfers()
        super()._close()
        self._device_buffers.clear()
        self._control_frames.clear()
        self._write_stage = self._write_done = None

    def _abort_transfers(self) -> None:
        """Abort the NCCL group: every pending transfer (captured ones too) ends.

        torch's ``abort()`` can block until its own timeout (seen on H200 while CUDA
        graphs that captured the group's transfers still exist), so it runs on a daemon
        thread and this waits at most :data:`ABORT_WAIT_S`.
        """
        nccl, self._nccl = self._nccl, None
        if nccl is None:
            return
        done = threading.Event()

        def abort() -> None:
            with contextlib.suppress(RuntimeError):  # nothing else to do
                nccl.abort()
            done.set()

        threading.Thread(target=abort, name="afd-nccl-abort", daemon=True).start()
        if not done.wait(ABORT_WAIT_S):
            logger.warning(
                "AFD: aborting the NCCL group of %s took over %g s; not waiting for it",
                self.name,
                ABORT_WAIT_S,
            )

    # Buffers ---------------------------------------------------------------------------

    def _allocate(self, nbytes: int) -> torch.Tensor:
        torch = self._torch
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        self._device_buffers[buf.data_ptr()] = buf
        return buf

    def _allocate_control(self, nbytes: int) -> torch.Tensor:
        """Control frames stay in host memory (gloo sends them; no device sync)."""
        frame = self._torch.empty(nbytes, dtype=self._torch.uint8)
        self._control_frames[frame.data_ptr()] = frame
        return frame

    def _buffer_at(self, addr: int) -> Any:
        buf = self._device_buffers.get(addr)
        if buf is None:
            raise AFDShutdown(f"AFD: {self.name} is closed (its buffers are gone)")
        return buf

    def _read_bytes(self, addr: int, nbytes: int) -> bytes:
        """Copy ``nbytes`` from the device buffer at ``addr`` to the host (synchronises)."""
        if addr in self._control_frames:
            return ctypes.string_at(addr, nbytes)
        host = self._buffer_at(addr)[:nbytes].cpu()
        return ctypes.string_at(host.data_ptr(), nbytes)

    def _write_bytes(self, addr: int, data: bytes) -> None:
        """Copy ``data`` to the device buffer at ``addr`` through pinned host memory.

        The copy is queued on the current stream (before the send that reads it); the
        staging buffer is reused once the previous copy has finished.
        """
        if addr in self._control_frames:
            ctypes.memmove(addr, data, len(data))
            return
        torch = self._torch
        stage, n = self._write_stage, len(data)
        if stage is None:
            raise AFDShutdown(f"AFD: {self.name} is closed")
        if self._write_done is not None:
            self._write_done.synchronize()
        ctypes.memmove(stage.data_ptr(), data, n)
        self._buffer_at(addr)[:n].copy_(stage[:n], non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self._device))
        self._write_done = done

    # Transport primitives --------------------------------------------------------------

    def _nccl_group(self) -> Any:
        pg = self._nccl
        if pg is None:
            raise AFDShutdown(f"AFD: {self.name} is closed")
        return pg

    def _post_send(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        if tag == TAG_CONTROL:
            return _ControlWork(super()._post_send(buf, peer, tag))
        pg = self._nccl_group()
        try:
            return pg.send([buf], peer, tag)
        except RuntimeError as exc:
            raise self._peer_failure(peer, "an NCCL send", str(exc), False) from exc

    def _post_recv(self, buf: torch.Tensor, peer: int, tag: int) -> Any:
        if tag == TAG_CONTROL:
            return _ControlWork(super()._post_recv(buf, peer, tag))
        pg = self._nccl_group()
        try:
            return pg.recv([buf], peer, tag)
        except RuntimeError as exc:
            raise self._peer_failure(peer, "an NCCL receive", str(exc), False) from exc

    def _wait(self, handle: Any, peer: int, deadline: float | None, what: Purpose) -> None:
        if isinstance(handle, _ControlWork):
            super()._wait(handle.work, peer, deadline, what)
            return
        try:
            if self._torch.cuda.is_current_stream_capturing():
                handle.wait()  # captured: the stream joins NCCL's; nothing to poll
                return
            while not handle.is_completed():
                if self.is_closed:
                    raise self._peer_failure(peer, what, "closed", False)
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._peer_failure(peer, what, "NCCL op still pending", True)
                time.sleep(0)  # let other threads (the control inbox) run
            handle.wait()  # the current stream waits for NCCL's (already done)
        except RuntimeError as exc:
            detail = str(exc).split("\n", 1)[0]
            raise self._peer_failure(peer, what, detail, False) from exc

    # CUDA graph steps --------------------------------------------------------------------

    def _send_step(self, payload: ControlPayload) -> None:
        """Send the payload; an eager step first waits for the replays still running."""
        if not payload.is_graph_step:
            self._drain_replays(f"eager step {payload.step_id}")
        super()._send_step(payload)

    def watch_graph_replay(self, step_id: int) -> None:
        """See :meth:`afd_core.connector.Connector.watch_graph_replay`."""
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        torch = self._torch
        if self._replays is None:
            self._replays = ReplayWatch(
                self._timeout_s, self._replay_overran, f"afd-replay-watch-a{self.role_rank}"
            )
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        self._replays.add(step_id, event)

    @contextlib.contextmanager
    def graph_capture(self) -> Iterator[None]:
        """See :meth:`afd_core.connector.Connector.graph_capture`."""
        replays = self._replays
        if replays is None:
            yield
            return
        self._drain_replays("a CUDA graph capture")
        replays.pause()
        try:
            yield
        finally:
            replays.resume()

    def _drain_replays(self, before: str) -> None:
        """Wait (bounded) for every watched replay to finish; raise if one overran."""
        replays = self._replays
        if replays is None or not replays.pending():
            return
        deadline = time.monotonic() + self._timeout_s
        if not replays.drain(deadline, lambda: self.is_closed or self._failure is not None):
            if self._failure is None and not self.is_closed:
                self._replay_overran(-1, before)
            self._raise_unusable()

    def _replay_overran(self, step_id: int, before: str = "") -> None:
        what = (
            f"the CUDA graph replays before {before}"
            if before
            else f"the CUDA graph replay of step {step_id}"
        )
        exc = self._peer_failure(self._ffn_world, what, "replay still running", True)
        self._fail(exc)
        self._abort_transfers()

    def wait_for_stream(self, what: str) -> None:
        """See :meth:`afd_core.connector.Connector.wait_for_stream`."""
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        torch = self._torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        deadline = time.monotonic() + self._timeout_s
        while not event.query():
            if self.is_closed:
                raise AFDShutdown(f"AFD: {self.name} was closed while waiting for {what}")
            if time.monotonic() >= deadline:
                peers = self.topology.peers_of(self.config.role, self.role_rank)
                exc = self._peer_failure(peers[0], what, "stream still running", True)
                self._fail(exc)
                self._abort_transfers()
                raise exc
            time.sleep(0)
