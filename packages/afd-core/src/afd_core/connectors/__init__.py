"""Built-in AFD connectors of afd-core.

* :mod:`afd_core.connectors.p2p_protocol`: the transport-independent P2P wire protocol
  (:class:`~afd_core.connectors.p2p_protocol.P2pProtocolConnector`), reused by the NCCL
  connector of afd-connectors-gpu;
* :mod:`afd_core.connectors.gloo`: ``P2pGlooAFDConnector``, the reference connector
  over gloo.

Importing this package imports neither torch nor a connector module; the registry loads
connectors lazily by ``"module:Class"``.
"""

from __future__ import annotations

__all__ = ["GLOO_CONNECTOR_TARGET"]

#: Lazy target of the reference connector for a ConnectorSpec.
GLOO_CONNECTOR_TARGET = "afd_core.connectors.gloo:P2pGlooAFDConnector"
