"""``P2pGlooAFDConnector``: the reference connector, P2P over gloo (CPU tensors, any platform).

Its recipe (:mod:`afd_core.assembly`): a link of its own per attention rank and its FFN
rank (an attention server may stop and be replaced while its FFN rank serves the others,
``ffn_idle_limit_s`` > 0, :mod:`afd_core.runtime.links`), steps announced by the
attention ranks, the gloo data plane (the link's gloo group under a second tag), the
P2P block pattern. World order: FFN ranks first; FFN rank 0 hosts the rendezvous store
at ``config.host:config.port``. ``connector_extra_config`` takes no fields.
"""

from __future__ import annotations

from afd_core.assembly import P2P_BLOCK, Control, Layout, P2pBlock, Recipe, gloo_data_plane
from afd_core.connector import Connector


class P2pGlooAFDConnector(Connector):
    """AFD connector: links, announced steps, gloo data plane, P2P block pattern."""

    name = "P2pGlooAFDConnector"
    pattern_type = P2pBlock

    def recipe(self) -> Recipe:
        """Links, announced steps, the gloo data plane, the P2P block pattern."""
        return Recipe(Layout.LINKS, Control.ANNOUNCED, gloo_data_plane(), P2P_BLOCK)
