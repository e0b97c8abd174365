"""The P2P block exchange: each FFN rank serves a contiguous block of attention ranks.

* :mod:`~afd_core.runtime.p2p.attention`: :class:`P2pAttentionEndpoint`;
* :mod:`~afd_core.runtime.p2p.ffn`: :class:`P2pFFNEndpoint`;
* their message forms (frames, header messages, bare tensors) and header rows are the
  runtime's one set, :mod:`afd_core.runtime.messages`.

:data:`P2P_BLOCK` is the pattern a recipe names (:mod:`afd_core.assembly`): its pairing
rule is the block rule of :mod:`afd_core.topology` (an attention rank exchanges with the
one FFN rank serving its block and announces its steps to it); it runs on a transport
plane, in either layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from afd_core.assembly import AttentionSide, FFNSide, Pattern, TransportPlane

if TYPE_CHECKING:
    from afd_core.runtime.p2p.attention import P2pAttentionEndpoint
    from afd_core.runtime.p2p.ffn import P2pFFNEndpoint


class P2pBlock(Pattern):
    """The P2P block pattern (see the module docstring)."""

    name: ClassVar[str] = "P2P block"
    data_plane = TransportPlane

    def attention_endpoint(self, side: AttentionSide) -> P2pAttentionEndpoint:
        from afd_core.runtime.p2p.attention import P2pAttentionEndpoint, P2pPeer

        (peer,) = side.peers
        assert side.announcer is not None, "the P2P block pattern needs announced steps"
        return P2pAttentionEndpoint(
            side.transport_context(),
            peer=P2pPeer(peer.ffn_rank, peer.transport_rank),
            control=side.announcer,  # type: ignore[arg-type]
            replays=side.replays,
        )

    def ffn_endpoint(self, side: FFNSide) -> P2pFFNEndpoint:
        from afd_core.runtime.p2p.ffn import P2pFFNEndpoint

        assert side.steps is not None, "the P2P block pattern needs announced steps"
        return P2pFFNEndpoint(
            side.transport_context(),
            links=side.links,
            inbox=side.steps,  # type: ignore[arg-type]
            replays=side.replays,
        )


#: The P2P block pattern.
P2P_BLOCK = P2pBlock()
