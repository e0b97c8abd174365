"""Attention seats: which server holds an attention rank of a running world, and its successor.

Connectors whose FFN rank gives every attention rank a link of its own (the P2P block
exchange over gloo, :mod:`afd_core.runtime.links`) let an attention rank leave and a new
server take its place, while the FFN rank keeps serving the others. The session store
records each attention rank's *seat* under ``afd/<session>/``:

* ``joined/attention/<a>``: how many servers joined as attention rank ``a`` (the
  rendezvous counts every join; the ``n``-th one claims generation ``n - 1``);
* ``seated/attention/<a>``: the generation whose link the serving FFN rank opened last;
* ``vacated/attention/<a>``: how many generations the FFN rank has let go (a link it
  closed after its attention rank left, or a claimant that never opened one);
* ``link/attention/<a>/<g>``: generation ``g``'s answer to the FFN rank, ``ready`` once
  its hello record matched every other rank's, else ``refused: <why>``.

A join is *the first* (generation 0, part of the world's start), *a replacement*
(generation ``g`` once ``g`` generations were vacated: the FFN rank then opens the link
of generation ``g``), or *a duplicate*: a second server for a rank whose seat is held.
A duplicate at start-up aborts the rendezvous for everyone, naming the rank (see
:func:`afd_core.runtime.rendezvous.exchange_hello`); a duplicate of a seated rank waits
:data:`VACANCY_WAIT_S` for the seat to be vacated (its predecessor may have just ended)
and then fails alone, naming the rank, while the deployment keeps serving.

Pure store logic: no torch import; the store is any object with ``add``, ``check``,
``get``, ``set`` (``torch.distributed.Store``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from afd_core.errors import AFDProtocolError, AFDShutdown

if TYPE_CHECKING:
    from afd_core.runtime.rendezvous import Session

#: Seconds a server that joined as an already seated attention rank waits for the seat
#: to be vacated: the FFN rank notices a predecessor that ended within the liveness
#: bound (afd_core.runtime.liveness.SILENCE_S) and lets its link go at its next step boundary.
VACANCY_WAIT_S = 8.0
#: The answer a claimant writes once its hello record matched everyone's.
READY = "ready"
_POLL_S = 0.05


def _joined_key(session: Session, rank: int) -> str:
    """The join counter of attention rank ``rank``."""
    return session.key("joined", "attention", rank)


def vacancies(session: Session, rank: int) -> int:
    """Generations of attention rank ``rank`` the FFN rank has let go so far."""
    return int(session.store.add(session.key("vacated", "attention", rank), 0))


def joins(session: Session, rank: int) -> int:
    """Servers that joined as attention rank ``rank`` so far."""
    return int(session.store.add(_joined_key(session, rank), 0))


def is_seated(session: Session, rank: int) -> bool:
    """Whether the FFN rank has opened a link with some generation of ``rank``."""
    return bool(session.store.check([session.key("seated", "attention", rank)]))


def mark_seated(session: Session, rank: int, generation: int) -> None:
    """FFN side: the link of ``generation`` of attention rank ``rank`` is open."""
    session.store.set(session.key("seated", "attention", rank), str(generation))


def vacate(session: Session, rank: int) -> int:
    """FFN side: let the current generation of ``rank`` go; the next generation's number."""
    return int(session.store.add(session.key("vacated", "attention", rank), 1))


def answer(session: Session, rank: int, generation: int, refusal: str | None) -> None:
    """Claimant side: tell the FFN rank that ``generation`` comes (``refusal`` None) or not."""
    text = READY if refusal is None else f"refused: {refusal}"
    session.store.set(session.key("link", "attention", rank, generation), text)


def read_answer(session: Session, rank: int, generation: int) -> str | None:
    """FFN side: generation ``generation``'s answer, or None while it has given none."""
    key = session.key("link", "attention", rank, generation)
    if not session.store.check([key]):
        return None
    return bytes(session.store.get(key)).decode()


def claim_vacated_seat(
    session: Session, rank: int, generation: int, should_stop: Callable[[], bool]
) -> None:
    """Wait (at most :data:`VACANCY_WAIT_S`) until generation ``generation`` of attention
    rank ``rank`` may take the seat, i.e. ``generation`` generations were vacated.

    Raises AFDProtocolError naming the rank when the seat stays held (a second server was
    started as a rank that is serving; its answer is written as a refusal, so the FFN
    rank does not wait for it later), AFDShutdown when ``should_stop`` turns true.
    """
    deadline = time.monotonic() + VACANCY_WAIT_S
    while vacancies(session, rank) < generation:
        if should_stop():
            raise AFDShutdown("AFD rendezvous: the connector was closed while waiting for a seat")
        if time.monotonic() >= deadline:
            problem = (
                f"AFD rendezvous: attention rank {rank} joined twice: it is serving already in "
                f"the deployment at {session.address}, and this server was started as "
                f"attention rank {rank} too; give each attention server its own role_rank, or "
                "stop the serving one first (its replacement may then join)"
            )
            answer(session, rank, generation, "a duplicate of a serving rank")
            raise AFDProtocolError(problem)
        time.sleep(_POLL_S)
