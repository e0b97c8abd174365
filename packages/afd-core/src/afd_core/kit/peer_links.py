"""An FFN endpoint's links to the attention ranks it serves: :class:`AttentionLink`, one
link, and :class:`FFNLinks`, the set of them as an FFN endpoint may use it.

The assembler hands a pattern's FFN endpoint its links
(:attr:`afd_core.assembly.FFNSide.links`); afd-core's runtime implements :class:`FFNLinks`
(``afd_core.runtime.links.BlockLinks``: replaceable links, seats, the idle limit) and may
change how, never what this protocol says. A third party's transport-plane pattern
types its FFN endpoint against this module, as afd-core's own patterns do.

A link is one of two kinds: every link shares the connector's one world (P2P over NCCL,
the expert exchange), or each has a world of its own (P2P over gloo), which lets it go
alone when its attention rank leaves (``ffn_idle_limit_s`` > 0). Changes to the set reach
the FFN endpoint only at step boundaries (:meth:`FFNLinks.settle`), so a step's plan never
sees a link released under it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from afd_core.dataplane.transport import TransferFailed, Transport
    from afd_core.errors import AFDError, AFDPeerError
    from afd_core.failures import PeerFailures
    from afd_core.runtime.world import World


@dataclass(eq=False)
class AttentionLink:
    """How the FFN rank reaches attention rank ``rank`` (``peer`` on both transports).

    ``control`` and ``data`` are its transports (``data`` None: the link carries control
    only, the data plane is an op plane); ``failures`` names the peer in errors;
    ``generation`` is the seat it serves (a replacement server takes the next); ``world``
    is the link's own world (None: it shares the connector's, and is the runtime's to
    handle); ``lost`` is the error that ended it, once it is lost.
    """

    rank: int
    peer: int
    control: Transport
    data: Transport | None
    failures: PeerFailures
    generation: int = 0
    world: World | None = None
    lost: AFDError | None = None

    @property
    def name(self) -> str:
        """``"attention rank 1 (world rank 2)"``."""
        return self.failures.describe(self.peer)


class FFNLinks(Protocol):
    """The links of one FFN rank, as its FFN endpoint uses them (any thread unless said).

    ``ffn_rank`` is the FFN rank; ``replacements`` counts the replacement links opened so
    far (for ``afd_stats``); ``last_loss`` is the last link let go, its error and when
    (``time.time()``), None before any.
    """

    ffn_rank: int
    replacements: int
    last_loss: tuple[str, float] | None

    def current(self) -> dict[int, AttentionLink]:
        """The links by attention rank, lost ones included until released."""
        ...

    def get(self, rank: int) -> AttentionLink:
        """The link of attention rank ``rank`` (KeyError: none)."""
        ...

    def on_change(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (from any thread) whenever a link is added or lost."""
        ...

    def lose(self, link: AttentionLink, error: AFDError) -> bool:
        """``link``'s peer is gone or its transfers failed: True when the link is let go
        (its transports interrupted, released at the next :meth:`settle`), False when
        the failure is the FFN rank's own. Never for protocol errors: they fail the rank."""
        ...

    def lose_transfer(self, link: AttentionLink, failure: TransferFailed, doing: str) -> None:
        """A transfer on ``link`` failed while ``doing`` (e.g. ``"layer 3 of step 17"``):
        let the link go (:meth:`lose`), or raise the AFDPeerError naming the peer and what
        was awaited."""
        ...

    def settle(
        self, before_release: Callable[[AttentionLink], None]
    ) -> tuple[list[AttentionLink], list[AttentionLink]]:
        """At a step boundary (the FFN loop's thread): release the lost links, calling
        ``before_release(link)`` first for each. Returns the links added and released
        since the last call."""
        ...

    def idle_error(self) -> AFDPeerError | None:
        """The failure of an FFN rank that has had no live link past its idle limit."""
        ...

    def idle_wait_s(self) -> float:
        """Seconds until :meth:`idle_error` may change (for a bounded wait)."""
        ...


def loss_record(loss: tuple[str, float] | None) -> dict[str, object] | None:
    """:attr:`FFNLinks.last_loss` as plain JSON values: ``{"error", "unix_time"}`` or None."""
    return None if loss is None else {"error": loss[0], "unix_time": loss[1]}
