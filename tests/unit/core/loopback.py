"""An in-process transport for endpoint tests (torch, no sockets), and worlds built on it.

``LoopbackTransport`` implements afd-core's transport contract in memory: a send is
delivered to the peer's queue at once (a copy of its bytes), a receive takes the next
message of that peer when waited for. Like gloo, it refuses a message larger than the
receive (gloo would abort the process) and accepts a shorter one;
``ExactLoopbackTransport`` accepts only a message of the receive's exact size, as NCCL
does, so the endpoints' exact-size paths run on a CPU too; ``DeviceLoopbackTransport``
also keeps its tensors in device memory and declares NCCL's pairing rule (ordered
pairs), so the endpoints' device paths (what NCCL takes: headers
copied to the device, checked there once per step) run on one GPU without NCCL; messages
still travel through host bytes. ``InOrderLoopbackTransport`` enforces NCCL's pairing
rule in host memory: a pair's operations, sends and receives alike, complete strictly in
each side's posting order, a send only against the peer's receive at the head of its
order, so an order that would deadlock NCCL's one stream per pair deadlocks here too
(and ends in a bounded "timeout"). :data:`DATA_PLANES` names the host and device
planes for parametrized tests. Closing a rank's transport wakes its own waits
("interrupted") and its peers' ("peer_closed").

``loopback_connectors(a, f, wire)`` builds real composed connectors (afd-core's control
channel and endpoints) whose world is a loopback fabric instead of a rendezvous.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import torch

from afd_core.assembly import (
    EXPERT_ROUTED,
    P2P_BLOCK,
    Control,
    Layout,
    Recipe,
    ReplayGuardSite,
    TransportPlane,
)
from afd_core.config import AFDConfig
from afd_core.connector import Connector, ConnectorParts, WireSpec
from afd_core.dataplane.transport import Transfer, TransferFailed, Transport
from afd_core.failures import PeerFailures
from afd_core.runtime.assembler import endpoint_on_world
from afd_core.runtime.parts import Parts
from afd_core.runtime.world import World


class Fabric:
    """Messages in flight between the loopback transports of one test."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[tuple[int, int, str], deque[bytes]] = defaultdict(deque)
        self.closed: set[int] = set()


class LoopbackTransport(Transport):
    """One rank's channel ``name`` on a :class:`Fabric` (see the module docstring)."""

    accepts_short_messages = True

    def __init__(self, fabric: Fabric, world_rank: int, name: str, device: str = "cpu") -> None:
        self._fabric = fabric
        self._rank = world_rank
        self._name = name
        self._device = torch.device(device)

    @property
    def device(self) -> torch.device:
        return self._device

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        return host if self._device.type == "cpu" else host.to(self._device)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.cpu()

    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        data = bytes(tensor.contiguous().view(-1).view(torch.uint8).cpu().numpy())
        with self._fabric.cond:
            if self._rank in self._fabric.closed:
                raise TransferFailed(peer, "interrupted", "loopback closed")
            self._fabric.queues[self._rank, peer, self._name].append(data)
            self._fabric.cond.notify_all()
        return Transfer(peer, None)

    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        return Transfer(peer, tensor)

    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        tensor = transfer.work
        if tensor is None:  # a send: delivered when posted
            return
        key = (transfer.peer, self._rank, self._name)
        fabric = self._fabric
        with fabric.cond:
            while not fabric.queues[key]:
                if self._rank in fabric.closed:
                    raise TransferFailed(transfer.peer, "interrupted", "loopback closed")
                if transfer.peer in fabric.closed:
                    raise TransferFailed(transfer.peer, "peer_closed", "loopback peer closed")
                fabric.cond.wait(0.05)
            data = fabric.queues[key].popleft()
        assert isinstance(tensor, torch.Tensor)
        flat = tensor.view(-1).view(torch.uint8)
        self._check_size(len(data), flat.numel())
        if data:
            flat[: len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def _check_size(self, message: int, room: int) -> None:
        assert message <= room, "gloo would abort this process"

    def interrupt(self) -> None:
        with self._fabric.cond:
            self._fabric.closed.add(self._rank)
            self._fabric.cond.notify_all()

    def close(self) -> None:
        self.interrupt()


class ExactLoopbackTransport(LoopbackTransport):
    """A loopback transport whose receives must match their message's size (as NCCL's)."""

    accepts_short_messages = False

    def _check_size(self, message: int, room: int) -> None:
        assert message == room, f"a {message}-byte message into a {room}-byte receive"


class DeviceLoopbackTransport(ExactLoopbackTransport):
    """An exact-size loopback in CUDA memory with NCCL's pairing rule."""

    ordered_pairs = True

    def __init__(self, fabric: Fabric, world_rank: int, name: str) -> None:
        super().__init__(fabric, world_rank, name, "cuda")


class _Op:
    """One posted operation of an :class:`InOrderLoopbackTransport`."""

    __slots__ = ("data", "done", "send", "tensor")

    def __init__(self, send: bool, tensor: torch.Tensor, data: bytes | None) -> None:
        self.send, self.tensor, self.data, self.done = send, tensor, data, False


class InOrderLoopbackTransport(ExactLoopbackTransport):
    """NCCL's pairing rule in host memory (see the module docstring): each pair's
    operations complete in posting order, a send only against a receive of its exact
    size; a head send and receive of different sizes never complete (NCCL does not
    define what they do), so their waits end in "timeout"."""

    ordered_pairs = True

    def __init__(self, fabric: Fabric, world_rank: int, name: str) -> None:
        super().__init__(fabric, world_rank, name)
        self._pending: dict[tuple[int, int, str], deque[_Op]] = fabric.__dict__.setdefault(
            "in_order", defaultdict(deque)
        )

    def post_send(self, tensor: torch.Tensor, peer: int) -> Transfer:
        data = bytes(tensor.contiguous().view(-1).view(torch.uint8).numpy())
        return self._post(peer, _Op(True, tensor, data))

    def post_recv(self, tensor: torch.Tensor, peer: int) -> Transfer:
        return self._post(peer, _Op(False, tensor, None))

    def _post(self, peer: int, op: _Op) -> Transfer:
        fabric = self._fabric
        with fabric.cond:
            if self._rank in fabric.closed:
                raise TransferFailed(peer, "interrupted", "loopback closed")
            self._pending[self._rank, peer, self._name].append(op)
            self._match(peer)
            fabric.cond.notify_all()
        return Transfer(peer, op)

    def _match(self, peer: int) -> None:
        """Complete the heads of the two sides' orders while one is a send and the other
        a receive (call with the fabric's lock held)."""
        mine = self._pending[self._rank, peer, self._name]
        theirs = self._pending[peer, self._rank, self._name]
        while mine and theirs and mine[0].send != theirs[0].send:
            sent, received = (mine[0], theirs[0]) if mine[0].send else (theirs[0], mine[0])
            assert sent.data is not None
            flat = received.tensor.view(-1).view(torch.uint8)
            if len(sent.data) != flat.numel():
                return  # NCCL leaves it undefined; here the pair is stuck (a bounded timeout)
            if sent.data:
                flat.copy_(torch.frombuffer(bytearray(sent.data), dtype=torch.uint8))
            mine.popleft().done = True
            theirs.popleft().done = True

    def wait(self, transfer: Transfer, deadline: float | None) -> None:
        op = transfer.work
        assert isinstance(op, _Op)
        fabric = self._fabric
        with fabric.cond:
            while not op.done:
                if self._rank in fabric.closed:
                    raise TransferFailed(transfer.peer, "interrupted", "loopback closed")
                if transfer.peer in fabric.closed:
                    raise TransferFailed(transfer.peer, "peer_closed", "loopback peer closed")
                if deadline is not None and time.monotonic() > deadline:
                    kind = "send" if op.send else "receive"
                    raise TransferFailed(
                        transfer.peer, "timeout", f"{kind} not matched in posting order"
                    )
                fabric.cond.wait(0.05)


_DATA_PLANES = {
    "short-receives": LoopbackTransport,
    "exact-sizes": ExactLoopbackTransport,
    "in-order": InOrderLoopbackTransport,
    "device": DeviceLoopbackTransport,
}

#: ``pytest.mark.parametrize("data_plane", DATA_PLANES)``: gloo's rule (a message may be
#: shorter than its receive), NCCL's exact sizes in host memory, and NCCL's rules in
#: device memory (skipped without a CUDA device).
DATA_PLANES = [
    "short-receives",
    "exact-sizes",
    "in-order",
    pytest.param(
        "device",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(),
            reason="the device data plane needs a CUDA device (run on a GPU host)",
        ),
    ),
]


class RecordingReplayGuard:
    """A replay guard for host transports: nothing runs on a device, calls are recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def watch(self, step_id: int) -> None:
        self.calls.append(("watch", step_id))

    def drain(self, before: str) -> None:
        self.calls.append(("drain", before))

    def capturing(self) -> AbstractContextManager[None]:
        @contextmanager
        def capture() -> Iterator[None]:
            self.calls.append(("capture", None))
            yield

        return capture()

    def wait_for_stream(self, what: str) -> None:
        self.calls.append(("wait_for_stream", what))

    def stop(self) -> None:
        self.calls.append(("stop", None))


class LoopbackConnector(Connector):
    """A composed P2P connector whose world is a loopback :class:`Fabric`.

    With ``graph_steps`` it has a :class:`RecordingReplayGuard` (``replays``), so CUDA
    graph steps run their host-side calls eagerly.
    """

    name = "Loopback"

    def __init__(
        self,
        fabric: Fabric,
        *args: Any,
        graph_steps: bool = False,
        data_plane: str = "short-receives",
    ) -> None:
        super().__init__(*args)
        self.fabric = fabric
        self.data_transport = _DATA_PLANES[data_plane]
        self.replays = RecordingReplayGuard() if graph_steps else None

    def recipe(self) -> Recipe:
        """The world is opened by :meth:`connect`; the recipe names the pattern."""
        pattern = EXPERT_ROUTED if self.config.splits_experts else P2P_BLOCK
        guard = None if self.replays is None else self._guard
        unused_plane = TransportPlane(lambda site: site.control)  # the fabric's, see connect
        return Recipe(Layout.WORLD, Control.ANNOUNCED, unused_plane, pattern, guard)

    def _guard(self, site: ReplayGuardSite) -> RecordingReplayGuard:
        assert self.replays is not None
        return self.replays

    def connect(self) -> ConnectorParts:
        timeout_s = float(self.config.afd_process_group_timeout_s)
        world = World(
            control=LoopbackTransport(self.fabric, self.world_rank, "control"),
            data=self.data_transport(self.fabric, self.world_rank, "data"),
            failures=PeerFailures(self.topology, timeout_s, self.fuse),
            timeout_s=timeout_s,
        )
        parts = Parts()
        parts.add(world.as_part("loopback world"))
        endpoint = endpoint_on_world(self.runtime_spec(), self.recipe(), world, parts)
        return ConnectorParts(endpoint, (parts.take_down,))


def loopback_connectors(
    a: int,
    f: int,
    wire: WireSpec,
    *,
    timeout_s: int = 5,
    gate: bool = False,
    graph_steps: bool = False,
    exchange: str = "block",
    data_plane: str = "short-receives",
) -> tuple[list[LoopbackConnector], list[LoopbackConnector]]:
    """``a`` attention and ``f`` FFN connectors of one initialised loopback world.

    ``exchange="expert"`` builds expert-routed connectors (the gate then runs on
    attention). FFN rank 0 is built first (it hosts the step relay's inbox).
    ``data_plane``: one of :data:`DATA_PLANES` (default: gloo's rules in host memory).
    """
    fabric = Fabric()

    def make(role: str, rank: int) -> LoopbackConnector:
        cfg = AFDConfig(
            role=role,  # type: ignore[arg-type]
            connector="Loopback",
            num_attention_ranks=a,
            num_ffn_ranks=f,
            afd_process_group_timeout_s=timeout_s,
            compute_gate_on_attention=gate or exchange == "expert",
            expert_placement="balanced" if exchange == "expert" else None,
        )
        conn = LoopbackConnector(
            fabric, cfg, rank, wire, graph_steps=graph_steps, data_plane=data_plane
        )
        conn.initialize()
        return conn

    ffn = [make("ffn", r) for r in range(f)]
    return [make("attention", r) for r in range(a)], ffn


def close_all(*groups: list[LoopbackConnector]) -> None:
    """Close every connector of ``groups``."""
    for group in groups:
        for conn in group:
            conn.close()
