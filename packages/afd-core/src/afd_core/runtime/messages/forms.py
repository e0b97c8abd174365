"""The header-then-tensors form, and the order in which a rank posts one exchange.

* :func:`headed`: a header message, then each tensor that has rows as a bare message (a
  tensor of no rows is not sent: the header says so and the receiver posts nothing);
* :func:`posting_order`: on a transport whose pair operations run in posting order
  (``ordered_pairs``: NCCL) a rank posts its sends first, since a receive posted first
  would block the send its peer waits for; elsewhere (gloo) its receives first, so the
  peer's answer never waits for a receive to be posted. Chosen once per transport; the
  per-layer path calls :meth:`PostingOrder.post`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from afd_core.dataplane.transport import PeerTransport, Transfer, Transport


def headed(header: torch.Tensor, tensors: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor]:
    """The messages of the header-then-tensors form: ``header``, then every tensor of
    ``tensors`` that is not None and has rows."""
    return [header, *(t for t in tensors if t is not None and t.shape[0])]


@dataclass(frozen=True)
class PostingOrder:
    """Posts the sends and receives of one exchange with a peer: the sends first, or the
    receives first (see the module docstring)."""

    sends_first: bool

    def post(
        self, to_peer: PeerTransport, sends: list[torch.Tensor], receives: list[torch.Tensor]
    ) -> list[Transfer]:
        """Post every send of ``sends`` and receive of ``receives`` on ``to_peer`` in this
        order; the transfers in posting order."""
        if self.sends_first:
            transfers = [to_peer.post_send(t) for t in sends]
            transfers.extend(to_peer.post_recv(t) for t in receives)
        else:
            transfers = [to_peer.post_recv(t) for t in receives]
            transfers.extend(to_peer.post_send(t) for t in sends)
        return transfers


SENDS_FIRST = PostingOrder(sends_first=True)
RECEIVES_FIRST = PostingOrder(sends_first=False)


def posting_order(transport: Transport) -> PostingOrder:
    """The order in which a rank posts an exchange on ``transport``."""
    return SENDS_FIRST if transport.ordered_pairs else RECEIVES_FIRST
