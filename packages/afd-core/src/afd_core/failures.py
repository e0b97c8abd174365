"""How the parts of a connector fail together: one :class:`Fuse`, one way to name a lost peer.

Every part of a composed connector (control channel, endpoint) holds the connector's
:class:`Fuse`. A part's public method is wrapped in :func:`guarded`: it refuses to run
once the fuse is blown (the connector was closed, or failed earlier) and blows the fuse
with any :class:`~afd_core.errors.AFDError` it raises, so every later call raises the
same error again ("close it and start again"): after a failed wait or a protocol error
the message stream between two ranks is no longer trustworthy.

:class:`PeerFailures` turns a transport's :class:`~afd_core.dataplane.transport.TransferFailed`
into the error a user reads: which peer, what this rank was waiting for, and what to do.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from afd_core.dataplane.transport import TransferFailed
from afd_core.errors import AFDError, AFDPeerError, AFDShutdown
from afd_core.topology import Role, Topology
from afd_core.wire import describe_rank

#: Seconds a transfer that failed because its peer closed the connection waits for this
#: rank's peer watch to report a crashed rank, whose loss made that peer close (the
#: error then names the crashed rank). A killed process is seen within milliseconds.
ROOT_CAUSE_GRACE_S = 0.5

P = ParamSpec("P")
R = TypeVar("R")


class Fuse:
    """Whether a connector may still be used: open, closed, or failed with an error.

    ``blown`` is a plain attribute (read on every hot-path call): True once closed or
    failed. Thread-safe: :meth:`close` may run on any thread.
    """

    __slots__ = ("_closed", "_departure", "_failed", "_failure", "_lock", "blown", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.blown = False
        self._closed = threading.Event()
        self._failed = threading.Event()
        self._failure: AFDError | None = None
        self._departure: AFDError | None = None
        self._lock = threading.Lock()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed.is_set()

    @property
    def failure(self) -> AFDError | None:
        """The error that failed the connector, if any (never AFDShutdown)."""
        return self._failure

    def close(self) -> None:
        """Mark the connector closed: every later guarded call raises AFDShutdown."""
        self._closed.set()
        self.blown = True

    def blow(self, exc: AFDError) -> None:
        """Remember ``exc`` as the connector's failure (the first one wins).

        Keeps a copy without traceback: the traceback's frames hold transport handles,
        and through them the process group and its port, after close(). AFDShutdown is
        not a failure (it is what a closed connector raises).
        """
        if isinstance(exc, AFDShutdown):
            return
        with self._lock:
            if self._failure is None:
                self._failure = type(exc)(str(exc))
            self.blown = True
        self._failed.set()

    def wait_failure(self, timeout_s: float) -> AFDError | None:
        """The connector's failure, waiting up to ``timeout_s`` for one (None: none came)."""
        self._failed.wait(timeout_s)
        return self._failure

    def depart(self, exc: AFDError) -> None:
        """A peer left in good order: fail at the next step boundary, not now (see
        :meth:`check_departure`); the first departure wins."""
        with self._lock:
            if self._departure is None:
                self._departure = type(exc)(str(exc))

    def check_departure(self) -> None:
        """At a step boundary: once a peer left, fail the connector with that and raise."""
        departure = self._departure
        if departure is not None:
            self.blow(departure)
            raise type(departure)(str(departure))

    def check_failure(self) -> None:
        """Raise the error that failed the connector (a copy, with its own message), if
        any: for a wait that learns of the failure first (another part blew the fuse)."""
        failure = self._failure
        if failure is not None:
            raise type(failure)(str(failure))

    def check(self) -> None:
        """Raise AFDShutdown when closed, the failure when failed; return otherwise."""
        if self.blown:
            raise self.error()

    def error(self) -> AFDError:
        """The error a call on this (blown) connector raises."""
        if self._closed.is_set():
            return AFDShutdown(f"AFD: {self.name} is closed")
        failure = self._failure
        assert failure is not None
        return type(failure)(f"{failure} (this connector failed earlier; close it and start again)")


class _HasFuse(Protocol):
    _fuse: Fuse


S = TypeVar("S", bound=_HasFuse)


def guarded(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Wrap a part's method: refuse when its ``_fuse`` is blown, blow it on AFDError."""

    @functools.wraps(method)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            return method(self, *args, **kwargs)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    return call


def guarded_until_closed(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R | None]:
    """Like :func:`guarded`, but a closed connector makes the call return None (the
    contract of a wait for the next step: closing ends it quietly)."""

    @functools.wraps(method)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R | None:
        fuse = self._fuse
        if fuse.closed:
            return None
        if fuse.blown:
            raise fuse.error()
        try:
            return method(self, *args, **kwargs)
        except AFDError as exc:
            if fuse.closed:
                return None
            fuse.blow(exc)
            raise

    return call


class PeerFailures:
    """Names the peers of one rank and explains transport failures in their terms.

    Peers are given as ranks of the transports the failures come from. ``world_ranks``
    maps them to world ranks when the transports span only part of the world (a link of
    its own between an FFN rank and one attention rank: ``world_ranks[i]`` is the world
    rank of transport rank ``i``); None: transport ranks are world ranks.
    """

    def __init__(
        self,
        topology: Topology,
        timeout_s: float,
        fuse: Fuse,
        world_ranks: tuple[int, ...] | None = None,
    ) -> None:
        self._topology = topology
        self._timeout_s = timeout_s
        self._fuse = fuse
        self._world_ranks = world_ranks

    def describe(self, peer: int) -> str:
        """``"FFN rank 0 (world rank 0)"`` for the peer that is world rank 0."""
        role, rank = self.role_of(peer)
        return describe_rank(self._topology, role, rank)

    def role_of(self, peer: int) -> tuple[Role, int]:
        """The role and role rank of the peer that is transport rank ``peer``."""
        world_rank = peer if self._world_ranks is None else self._world_ranks[peer]
        return self._topology.role_of_world_rank(world_rank)

    def error(self, failure: TransferFailed, doing: str, peer: int | None = None) -> AFDError:
        """The error for ``failure`` while this rank was waiting for ``doing``.

        ``doing`` reads like ``"layer 3 of step 17"``; ``peer`` (a transport rank) names
        the peer when the failure does not. ``failure`` is consumed: its traceback and chain
        are dropped (their frames hold transfers, and through them the process group).
        """
        failure.__traceback__ = failure.__context__ = failure.__cause__ = None
        if self._fuse.closed:
            return AFDShutdown(f"AFD: {self._fuse.name} was closed while waiting for {doing}")
        failed = failure.peer if failure.peer is not None else peer
        who = "a peer" if failed is None else self.describe(failed)
        if failure.reason == "peer_closed":
            # A peer that closes may be the second to go: it failed because another rank
            # crashed, whose loss this rank's peer watch reports within milliseconds.
            # Name that root cause when it comes within the grace.
            self._fuse.wait_failure(ROOT_CAUSE_GRACE_S)
        cause = self._fuse.failure
        if failure.reason in ("interrupted", "peer_closed") and cause is not None:
            return type(cause)(f"{cause} (while waiting for {doing})")
        if failure.reason == "timeout":
            return AFDPeerError(
                f"AFD: {who} did not answer within {self._timeout_s:g} s ({doing}); it is "
                "stuck or overloaded, or the roles disagree on the step sequence "
                f"(afd_process_group_timeout_s sets this limit) [{failure.detail}]"
            )
        role = "a" if failed is None else self.role_of(failed)[0]
        return AFDPeerError(
            f"AFD: {who} closed the connection during {doing}; the "
            f"{'FFN' if role == 'ffn' else 'attention'} role stopped or crashed — see its "
            f"log [{failure.detail}]"
        )


def layer_of_step(layer: int, step_id: int) -> str:
    """``"layer 3 of step 17"``: what a data wait is for, in error messages."""
    return f"layer {layer} of step {step_id}"
