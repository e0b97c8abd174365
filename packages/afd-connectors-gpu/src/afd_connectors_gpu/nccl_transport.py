"""``NcclTransport``: afd-core's transport contract over a dedicated ``ProcessGroupNCCL``.

The group is AFD's own (built on the session store's ``nccl/`` prefix), never vLLM's, so
AFD transfers never queue behind vLLM's collectives. Facts of NCCL (through torch 2.11 on
H200) that shape it:

* torch runs every p2p operation between two ranks on one communicator and one stream,
  in posting order, sends and receives alike (``ordered_pairs``): a receive posted before
  a send to the same peer blocks that send. Message sizes must match exactly
  (``accepts_short_messages`` is False). Two stages per step still pair: the attention
  endpoints post each reply's receive inside ``send``, so a pair's order is
  ``S(L,0) R(L,0) S(L,1) R(L,1)`` on both sides (the FFN rank serves layer-major, stage
  by stage); stage 1's message waits on the stream behind stage 0's reply
  (``tests/unit/roles/test_two_stages_ordered_pairs.py``, docs/cuda.md).
* A pair's communicator is built at its first operation, which blocks both ranks until
  the other arrives: :meth:`NcclTransport.open` does that for every data peer at once,
  one byte each way, bounded by the timeout, rather than in a step.
* ``Work.wait()`` only makes the caller's current stream wait for NCCL's; it never
  blocks the host. So :meth:`NcclTransport.wait` costs no host round trip (eager steps
  and graph captures alike), and the host waits only in :meth:`NcclTransport.synchronize`
  (an event on the current stream, polled until the deadline) and :meth:`to_host`.
  Past the deadline the group is aborted, which ends every pending transfer (captured
  ones too), and the wait raises "timeout".
* ``abort()`` can block until torch's own timeout while CUDA graphs that captured the
  group's transfers still exist (seen on H200): it runs on a daemon thread, waited for at
  most :data:`ABORT_WAIT_S`.
* ``NCCL_GRAPH_MIXING_SUPPORT`` defaults to 0 in this process (a graph of many p2p ops
  replays much faster then: docs/performance.md); that is safe only while
  captured and uncaptured operations of one communicator are never in flight together,
  which the connectors keep (an eager step first drains the replays still running).

Importing this module imports no torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

from afd_core.dataplane.op_provider import GroupOpener
from afd_core.dataplane.transport import Transfer, TransferFailed, Transport
from afd_core.errors import AFDConfigError, AFDPeerError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds :meth:`NcclTransport.interrupt` waits for torch's abort.
ABORT_WAIT_S = 5.0
#: NCCL's own watchdog limit exceeds the AFD timeout by this much, so a stuck peer
#: surfaces as the connector's AFDPeerError rather than as the watchdog ending the process.
WATCHDOG_MARGIN_S = 60.0
#: NCCL setting for graphs of many p2p ops, applied unless the environment sets it.
GRAPH_MIXING_ENV = "NCCL_GRAPH_MIXING_SUPPORT"


class NcclTransport(Transport):
    """The transport contract over one NCCL group on the current CUDA device."""

    ordered_pairs: ClassVar[bool] = True
    accepts_short_messages: ClassVar[bool] = False

    def __init__(self, group: object, device: torch.device) -> None:
        import torch

        self._torch = torch
        self._group: object | None = group
        self._device = device
        self._aborted = threading.Event()

    @classmethod
    def open(
        cls,
        opener: GroupOpener,
        world_rank: int,
        world_size: int,
        peers: tuple[int, ...],
        timeout_s: float,
        *,
        high_priority_stream: bool = False,
    ) -> NcclTransport:
        """Create the NCCL group and the communicators of ``peers`` (world ranks).

        Raises AFDConfigError without CUDA or NCCL, AFDPeerError when a rank does not
        come within ``timeout_s``.
        """
        import torch
        import torch.distributed as dist

        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise AFDConfigError(
                "AFD: the NCCL transport needs CUDA and torch.distributed's NCCL backend; "
                "this torch has none: use P2pGlooAFDConnector"
            )
        os.environ.setdefault(GRAPH_MIXING_ENV, "0")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s + WATCHDOG_MARGIN_S)
        options.is_high_priority_stream = high_priority_stream
        try:
            group = dist.ProcessGroupNCCL(
                opener.prefix_store("nccl"), world_rank, world_size, options
            )
        except RuntimeError as exc:
            raise AFDPeerError(
                f"AFD: creating the NCCL group of {world_size} ranks at {opener.address} "
                f"failed ({exc}); see the logs of the other ranks"
            ) from exc
        transport = cls(group, torch.device("cuda", torch.cuda.current_device()))
        try:
            transport._connect_pairs(world_rank, peers, time.monotonic() + timeout_s)
        except TransferFailed as exc:
            transport.close()
            raise AFDPeerError(
                f"AFD: setting up NCCL with world rank {exc.peer} failed ({exc.reason}: "
                f"{exc.detail}); see that rank's log"
            ) from None
        return transport

    def _connect_pairs(self, world_rank: int, peers: tuple[int, ...], deadline: float) -> None:
        """One byte each way with every peer (the lower world rank sends first)."""
        byte = self._torch.zeros(1, dtype=self._torch.uint8, device=self._device)
        for peer in peers:
            if world_rank < peer:
                transfers = [self.post_send(byte, peer), self.post_recv(byte, peer)]
            else:
                transfers = [self.post_recv(byte, peer), self.post_send(byte, peer)]
            self.wait_all(transfers, deadline)
            self.synchronize(deadline)

    @property
    def device(self) -> torch.device:
        return self._device

    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        try:
            return Transfer(peer, self._live_group(peer).send([tensor], peer, 0))
        except RuntimeError as exc:
            raise self._failure(peer, exc) from exc

    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        try:
            return Transfer(peer, self._live_group(peer).recv([tensor], peer, 0))
        except RuntimeError as exc:
            raise self._failure(peer, exc) from exc

    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        """Order the current stream after ``transfer`` (no host wait; see the module docstring)."""
        try:
            transfer.work.wait()  # type: ignore[attr-defined]
        except RuntimeError as exc:
            raise self._failure(transfer.peer, exc) from exc

    def synchronize(self, deadline: float) -> None:
        """Poll an event of the current stream until it completes or ``deadline`` passes.

        Past the deadline the group is aborted (pending transfers end) and this raises
        TransferFailed("timeout"); once interrupted, "interrupted".
        """
        torch = self._torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        while not event.query():
            if self._aborted.is_set():
                raise TransferFailed(-1, "interrupted", "the NCCL group was aborted")
            if time.monotonic() >= deadline:
                self.interrupt()
                raise TransferFailed(-1, "timeout", "NCCL transfers still pending")
            time.sleep(0)  # let other threads (control receivers) run

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self._device)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.cpu()

    def interrupt(self) -> None:
        """Abort the group on a daemon thread (bounded by :data:`ABORT_WAIT_S`)."""
        group, self._group = self._group, None
        self._aborted.set()
        if group is None:
            return
        done = threading.Event()

        def abort() -> None:
            with contextlib.suppress(RuntimeError):  # nothing else to do
                group.abort()  # type: ignore[attr-defined]
            done.set()

        threading.Thread(target=abort, name="afd-nccl-abort", daemon=True).start()
        if not done.wait(ABORT_WAIT_S):
            logger.warning("AFD: aborting the NCCL group took over %g s; not waiting", ABORT_WAIT_S)

    def close(self) -> None:
        self.interrupt()

    def _live_group(self, peer: int) -> object:
        group = self._group
        if group is None:
            raise TransferFailed(peer, "interrupted", "the NCCL group is closed")
        return group

    def _failure(self, peer: int, exc: RuntimeError) -> TransferFailed:
        detail = str(exc).split("\n", 1)[0]
        if self._aborted.is_set():
            return TransferFailed(peer, "interrupted", detail)
        return TransferFailed(peer, "peer_closed", detail)
