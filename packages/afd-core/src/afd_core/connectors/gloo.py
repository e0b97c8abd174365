"""``P2pGlooAFDConnector``: the reference connector, P2P over gloo (CPU tensors, any platform).

Composed of afd-core's parts (docs/design.md): the rendezvous of :mod:`afd_core.rendezvous`,
a control channel and a data plane each on a gloo group of its own
(:mod:`afd_core.transport.gloo`), and the P2P endpoints of :mod:`afd_core.p2p`. World
order: FFN ranks first; FFN rank 0 hosts the rendezvous store at ``config.host:config.port``.
``connector_extra_config`` takes no fields.
"""

from __future__ import annotations

from afd_core.connector import Connector, ConnectorParts
from afd_core.p2p import open_p2p
from afd_core.world import gloo_data_transport


class P2pGlooAFDConnector(Connector):
    """AFD connector: gloo control channel, gloo data plane, P2P endpoints."""

    name = "P2pGlooAFDConnector"

    def connect(self) -> ConnectorParts:
        """Rendezvous, then the control and data groups and this role's P2P endpoint."""
        return open_p2p(self, gloo_data_transport)
