"""An FFN rank's links to the attention ranks it serves, and attention ranks that come and go.

Shared by both exchange patterns: P2P (the attention ranks of the FFN rank's block) and
expert-routed (every attention rank).

An :class:`~afd_core.kit.peer_links.AttentionLink` (the contract's record) is how an FFN
rank reaches one attention rank: the control and data transports it uses, that rank's
number on them and how to name it in errors.
Either every link shares the connector's one world (P2P over NCCL, the expert exchange)
or each has a world of its own (:func:`afd_core.runtime.world.open_link_world`: P2P over gloo).

:class:`BlockLinks` holds them (it is the runtime's :class:`~afd_core.kit.peer_links.FFNLinks`)
and decides what losing one means:

* *shared* links, or an FFN rank without an idle limit (``ffn_idle_limit_s`` 0): an
  attention rank that leaves is a failure of the FFN rank, as it always was;
* *replaceable* links (own worlds and an idle limit): the FFN rank lets that link go
  (:meth:`BlockLinks.lose` interrupts only that link's transports, so the waits on it
  end and the steps in flight with the other attention ranks finish) and keeps serving
  the others. At its next step boundary the FFN loop releases the link and vacates the
  rank's seat (:mod:`afd_core.runtime.seats`); the :class:`LinkAcceptor` thread then opens the
  link of the server that takes the seat. With no attention rank linked for
  ``ffn_idle_limit_s`` the FFN rank fails (:meth:`BlockLinks.idle_error`).

Changes to the set of links reach the FFN loop only at step boundaries
(:meth:`BlockLinks.settle`, called by the control inbox), so a step's plan never sees a
link released under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from afd_core.errors import AFDError, AFDPeerError
from afd_core.kit.peer_links import AttentionLink
from afd_core.runtime import seats
from afd_core.runtime.world import ATTENTION_ON_LINK, open_link_world, peer_departed, peer_lost

if TYPE_CHECKING:
    from afd_core.assembly import RuntimeSpec, TransportFactory
    from afd_core.dataplane.transport import TransferFailed
    from afd_core.runtime.rendezvous import Session
    from afd_core.runtime.world import World

# A child of vLLM's logger, so vLLM's logging config applies in a server.
logger = logging.getLogger(f"vllm.{__name__}")

#: Seconds between two looks of the acceptor at the store.
ACCEPT_POLL_S = 0.2


def shared_links(world: World, senders: dict[int, int]) -> list[AttentionLink]:
    """Links over one shared ``world``: ``senders`` maps attention ranks to world ranks."""
    return [
        AttentionLink(rank, peer, world.control, world.data, world.failures)
        for rank, peer in senders.items()
    ]


@dataclass
class _Changes:
    """What the FFN loop has yet to take in at its next step boundary."""

    added: list[AttentionLink] = field(default_factory=list)
    lost: list[AttentionLink] = field(default_factory=list)


class BlockLinks:
    """The links of FFN rank ``ffn_rank`` (see the module docstring).

    ``replaceable``: losing a link lets it go instead of failing the FFN rank; then
    ``session`` (the rendezvous session, for the seat records) is required and
    ``idle_limit_s`` bounds the time without any linked attention rank. ``owns_seats``:
    this FFN rank vacates the seat of a link it releases (False on an expert-routed
    follower: FFN rank 0 keeps the seats of every attention rank).
    """

    def __init__(
        self,
        ffn_rank: int,
        links: list[AttentionLink],
        *,
        replaceable: bool = False,
        session: Session | None = None,
        idle_limit_s: float = 0.0,
        owns_seats: bool = True,
    ) -> None:
        if replaceable and session is None:
            raise ValueError("BlockLinks: replaceable links need the rendezvous session")
        self.ffn_rank = ffn_rank
        self.replaceable = replaceable
        self.owns_seats = owns_seats
        self._session = session
        self._idle_limit_s = idle_limit_s
        self._lock = threading.Lock()
        self._links: dict[int, AttentionLink] = {}
        #: The latest generation linked per attention rank (kept after its link goes).
        self._generations: dict[int, int] = {}
        for link in links:
            self._keep(link)
        self._changes = _Changes()
        self._idle_since: float | None = None
        self._listeners: list[Callable[[], None]] = []
        #: Replacement links opened so far (a counter for afd_stats).
        self.replacements = 0
        #: The last link let go: its error and when (``time.time()``); None: none yet.
        self.last_loss: tuple[str, float] | None = None

    def on_change(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (any thread) whenever a link is added or lost."""
        self._listeners.append(wake)

    def current(self) -> dict[int, AttentionLink]:
        """The links by attention rank, lost ones included until released."""
        with self._lock:
            return dict(self._links)

    def get(self, rank: int) -> AttentionLink:
        """The link of attention rank ``rank``."""
        with self._lock:
            return self._links[rank]

    def of_world(self, world: World) -> AttentionLink | None:
        """The link whose own world ``world`` is (None: not one of these links)."""
        with self._lock:
            return next((link for link in self._links.values() if link.world is world), None)

    def holds(self, rank: int) -> bool:
        """Whether ``rank`` has a link (live or not yet released)."""
        with self._lock:
            return rank in self._links

    def latest_generation(self, rank: int) -> int:
        """The latest generation of ``rank`` this FFN rank has linked (-1: none yet)."""
        with self._lock:
            return self._generations.get(rank, -1)

    def _keep(self, link: AttentionLink) -> None:
        """Hold ``link`` as its rank's link (caller holds the lock, or owns the object)."""
        self._links[link.rank] = link
        self._generations[link.rank] = max(link.generation, self._generations.get(link.rank, -1))

    def lose(self, link: AttentionLink, error: AFDError) -> bool:
        """``link``'s peer is gone or its transfers failed (``error`` says how): True when
        the link is let go (replaceable links; its transports are interrupted, the FFN loop
        releases it at its next step boundary), False when the failure is the FFN rank's
        (shared links, no idle limit). Protocol errors never come here: they fail the
        FFN rank."""
        if not self.replaceable:
            return False
        with self._lock:
            if link.lost is not None or self._links.get(link.rank) is not link:
                return True
            link.lost = type(error)(str(error))
            self.last_loss = (str(link.lost), time.time())
            self._changes.lost.append(link)
            others = sum(1 for other in self._links.values() if other.lost is None)
        logger.warning(
            "AFD FFN rank %d: %s; this FFN rank keeps its model, serves the %d other attention "
            "rank(s) of its block and accepts a replacement server for this rank at any time "
            "(with none linked it waits up to %g s, ffn_idle_limit_s)",
            self.ffn_rank, link.lost, others, self._idle_limit_s,
        )  # fmt: skip
        assert link.world is not None
        link.world.interrupt()
        self._notify()
        return True

    def lose_transfer(self, link: AttentionLink, failure: TransferFailed, doing: str) -> None:
        """A transfer on ``link`` failed while ``doing`` (e.g. "layer 3 of step 17"): let
        the link go (:meth:`lose`) or, where losing it fails the FFN rank, raise the
        AFDPeerError that names the peer and what was awaited."""
        error = link.failures.error(failure, doing)
        if not self.lose(link, error):
            raise error from None

    def add_initial(self, link: AttentionLink) -> None:
        """A link of the world's start (before the FFN loop runs)."""
        with self._lock:
            self._keep(link)

    def add(self, link: AttentionLink) -> None:
        """A replacement link is open (acceptor thread); the FFN loop takes it in."""
        with self._lock:
            self._keep(link)
            self._changes.added.append(link)
            self.replacements += 1
        logger.info(
            "AFD FFN rank %d: new attention ranks joined: %s took its seat (generation %d)",
            self.ffn_rank, link.name, link.generation,
        )  # fmt: skip
        self._notify()

    def settle(
        self, before_release: Callable[[AttentionLink], None]
    ) -> tuple[list[AttentionLink], list[AttentionLink]]:
        """At a step boundary (FFN loop): release the lost links and vacate their seats
        (where this FFN rank owns them).

        ``before_release(link)`` runs first for each (the inbox ends its receiver thread).
        Returns the links added and released since the last call.
        """
        with self._lock:
            changes, self._changes = self._changes, _Changes()
        for link in changes.lost:
            before_release(link)
            assert link.world is not None
            link.world.release()
            session = self._session
            if session is None or not self.owns_seats:  # closed meanwhile, or not ours
                self._drop(link)
                continue
            try:
                seats.vacate(session, link.rank)  # before the link goes: see LinkAcceptor
            except RuntimeError as exc:  # the store went with FFN rank 0
                logger.warning(
                    "AFD FFN rank %d: cannot free the seat of attention rank %d in the "
                    "rendezvous store (%s); no server can replace it",
                    self.ffn_rank, link.rank, exc,
                )  # fmt: skip
            self._drop(link)
        return changes.added, changes.lost

    def _drop(self, link: AttentionLink) -> None:
        with self._lock:
            if self._links.get(link.rank) is link:
                del self._links[link.rank]

    def idle_error(self) -> AFDPeerError | None:
        """The failure of an FFN rank without linked attention ranks past its idle limit."""
        with self._lock:
            live = any(link.lost is None for link in self._links.values())
        if live or not self.replaceable:
            self._idle_since = None
            return None
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self._idle_limit_s:
            return None
        return AFDPeerError(
            f"AFD FFN rank {self.ffn_rank}: no attention rank came within "
            f"ffn_idle_limit_s={self._idle_limit_s:g} s after the last ones left; start the "
            "attention servers, or raise ffn_idle_limit_s"
        )

    def idle_wait_s(self) -> float:
        """Seconds until :meth:`idle_error` may change (for a bounded wait)."""
        if self._idle_since is None:
            return 1.0
        return max(0.05, min(1.0, self._idle_since + self._idle_limit_s - time.monotonic()))

    def interrupt(self) -> None:
        """Interrupt every link's transports (say goodbye, wake their waits)."""
        for link in self.current().values():
            if link.world is not None:
                link.world.interrupt()

    def close(self) -> None:
        """Interrupt and release every link (connector shutdown). Drops the listeners and
        the session too: the rendezvous store goes with its last reference."""
        with self._lock:
            links, self._links = list(self._links.values()), {}
            self._listeners.clear()
            self._session = None
        for link in links:
            if link.world is not None:
                link.world.interrupt()
        for link in links:
            if link.world is not None:
                link.world.release()

    def _notify(self) -> None:
        for wake in self._listeners:
            wake()


#: Opens the FFN side's link with ``(attention rank, generation)``.
LinkOpener = Callable[[int, int], AttentionLink]


def open_ffn_links(
    spec: RuntimeSpec,
    data: TransportFactory,
    session: Session,
    ranks: tuple[int, ...],
    *,
    replaceable: bool,
    owns_seats: bool,
) -> tuple[BlockLinks, LinkOpener]:
    """The FFN rank's links of its own (:func:`afd_core.runtime.world.open_link_world`) with every
    attention rank of ``ranks``, generation 0, and how to open a later generation's.

    ``replaceable``: a link whose attention rank is lost or leaves is let go (see
    :class:`BlockLinks`); otherwise that fails the FFN rank, as in a world of every rank.
    ``owns_seats``: this FFN rank keeps the seat records of ``ranks`` (marks them seated
    here, vacates them when it lets a link go); exactly one FFN rank owns each seat.
    Bounded by the AFD timeout; closes what it opened when it raises.
    """
    ffn_rank = spec.role_rank
    links = BlockLinks(
        ffn_rank, [], replaceable=replaceable, session=session,
        idle_limit_s=float(spec.config.ffn_idle_limit_s), owns_seats=owns_seats,
    )  # fmt: skip

    def lost(world: World, error: AFDPeerError) -> None:
        link = links.of_world(world)
        if link is None or not links.lose(link, error):
            # The FFN rank fails: the failure first, so that every wait the interrupt
            # ends reports it, then every wait on every link ends.
            spec.fuse.blow(error)
            links.interrupt()
            peer_lost(spec, world, error)

    def departed(world: World, peer: int, error: AFDPeerError) -> None:
        link = links.of_world(world)
        if link is None or not links.lose(link, error):
            peer_departed(spec, world, peer, error)

    def open_one(rank: int, generation: int) -> AttentionLink:
        world = open_link_world(
            spec, data, session, rank, ffn_rank, generation, on_lost=lost, on_departed=departed
        )
        return AttentionLink(
            rank, ATTENTION_ON_LINK, world.control, world.data, world.failures, generation, world
        )

    try:
        for rank in ranks:
            links.add_initial(open_one(rank, 0))
            if replaceable and owns_seats:
                seats.mark_seated(session, rank, 0)
    except BaseException:
        links.close()
        raise
    return links, open_one


class LinkAcceptor:
    """FFN side: opens the link of each server that takes a vacated seat of ``ranks``.

    A daemon thread looks at the seat records every :data:`ACCEPT_POLL_S`. For a rank of
    ``ranks`` without a link whose next generation has joined, it waits for that
    claimant's answer (only a generation later than any this FFN rank linked: a follower
    may let a link go before the seat's owner vacates it): ``ready`` opens the link
    (``open_link_world``, bounded by the AFD timeout) and hands it to ``links``. Where
    ``links`` own the seats it also marks the
    seat taken and, for a refusal, a claimant that gives no answer within ``timeout_s``
    of the join or a link that cannot be opened, vacates the seat again with a warning in
    the log, so the next server may take it; an FFN rank that does not own the seats
    (an expert-routed follower) leaves those cases to the one that does.
    """

    def __init__(
        self,
        links: BlockLinks,
        session: Session,
        ranks: tuple[int, ...],
        open_link_world: LinkOpener,
        timeout_s: float,
    ) -> None:
        self._links = links
        self._session = session
        self._ranks = ranks
        self._open_link_world = open_link_world
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._first_seen: dict[tuple[int, int], float] = {}
        self._thread = threading.Thread(
            target=self._run, name=f"afd-link-acceptor-f{links.ffn_rank}", daemon=True
        )

    def start(self) -> None:
        """Start the acceptor thread."""
        self._thread.start()

    def stop(self, join_timeout_s: float) -> None:
        """End the thread (a link it opens meanwhile is released again)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(ACCEPT_POLL_S):
            for rank in self._ranks:
                if self._stop.is_set():
                    return
                try:
                    self._look_at(rank)
                except RuntimeError as exc:  # the store is gone: the connector is closing
                    if not self._stop.is_set():
                        logger.warning("AFD FFN: the seat records cannot be read (%s)", exc)
                    return

    def _look_at(self, rank: int) -> None:
        if self._links.holds(rank):
            return
        session, owns_seats = self._session, self._links.owns_seats
        generation = seats.vacancies(session, rank)
        if generation <= self._links.latest_generation(rank):
            # That server was linked here and has left; the FFN rank that owns the seat has
            # not vacated it yet (a follower may let its link go first).
            return
        if seats.joins(session, rank) <= generation:
            return  # nobody claims the seat
        answer = seats.read_answer(session, rank, generation)
        key = (rank, generation)
        if answer is None:
            first = self._first_seen.setdefault(key, time.monotonic())
            if owns_seats and time.monotonic() - first > self._timeout_s:
                self._give_up(rank, generation, f"it gave no answer within {self._timeout_s:g} s")
            return
        if answer != seats.READY:
            if owns_seats:
                self._give_up(rank, generation, answer)
            return
        try:
            link = self._open_link_world(rank, generation)
        except (AFDError, OSError) as exc:  # OSError: its liveness listener
            if owns_seats:
                self._give_up(rank, generation, f"its link could not be opened ({exc})")
            else:
                logger.warning(
                    "AFD FFN rank %d: the link with attention rank %d (generation %d) could "
                    "not be opened (%s); FFN rank 0 decides whether the seat is given up",
                    self._links.ffn_rank, rank, generation, exc,
                )  # fmt: skip
            return
        if self._stop.is_set():
            assert link.world is not None
            link.world.interrupt()
            link.world.release()
            return
        if owns_seats:
            seats.mark_seated(session, rank, generation)
        self._links.add(link)

    def _give_up(self, rank: int, generation: int, why: str) -> None:
        logger.warning(
            "AFD FFN rank %d: the server that joined as attention rank %d (generation %d) "
            "does not take its seat: %s",
            self._links.ffn_rank, rank, generation, why,
        )  # fmt: skip
        self._first_seen.pop((rank, generation), None)
        seats.vacate(self._session, rank)
