"""Built-in AFD connectors of afd-core and the P2P protocol they share.

* :mod:`~afd_core.connectors.gloo`: ``P2pGlooAFDConnector``, the reference connector
  (P2P messages over a dedicated gloo process group, CPU tensors);
* :mod:`~afd_core.connectors.p2p_protocol`: ``P2pProtocolConnector``, the transport-
  independent protocol that the NCCL connector of afd-connectors-gpu reuses, with
  :mod:`~afd_core.connectors.p2p_wire` (byte formats, step assembly),
  :mod:`~afd_core.connectors.p2p_buffers` (message buffers) and
  :mod:`~afd_core.connectors.p2p_control` (the FFN side's control inbox).

Importing this package imports neither torch nor a connector module: the registry loads
connectors lazily by ``"module:Class"``. ``docs/wire-protocol.md`` describes the protocol.
"""
