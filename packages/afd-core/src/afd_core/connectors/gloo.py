"""``P2pGlooAFDConnector``: the reference connector, P2P over gloo (CPU tensors, any platform).

Composed of afd-core's parts (docs/design.md): the rendezvous of :mod:`afd_core.runtime.rendezvous`,
one link per attention rank and its FFN rank (:func:`afd_core.runtime.p2p.open_p2p_links`: a gloo
group carrying the control channel and the data plane under two tags,
:mod:`afd_core.runtime.gloo`, and a liveness connection), and the P2P endpoints of
:mod:`afd_core.runtime.p2p`. An attention server may stop and be replaced while its FFN rank
serves the others (``ffn_idle_limit_s`` > 0, :mod:`afd_core.runtime.links`). World order:
FFN ranks first; FFN rank 0 hosts the rendezvous store at ``config.host:config.port``.
``connector_extra_config`` takes no fields.
"""

from __future__ import annotations

from afd_core.connector import Connector, ConnectorParts
from afd_core.runtime.p2p import open_p2p_links
from afd_core.runtime.world import gloo_data_transport


class P2pGlooAFDConnector(Connector):
    """AFD connector: gloo control channel, gloo data plane, P2P endpoints, a link of its
    own per attention rank (an attention server may be replaced)."""

    name = "P2pGlooAFDConnector"

    @property
    def replaces_attention_ranks(self) -> bool:
        """True: every attention rank has a link of its own."""
        return True

    def connect(self) -> ConnectorParts:
        """Rendezvous, then this rank's links (gloo groups) and its P2P endpoint."""
        return open_p2p_links(self, gloo_data_transport)
