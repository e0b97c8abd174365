"""afd-core's own connectors, composed of afd-core's public parts.

* :mod:`~afd_core.connectors.gloo`: ``P2pGlooAFDConnector``, the reference connector
  (P2P over gloo, CPU tensors).

The parts live in their own packages: :mod:`afd_core.transport` (the transport contract
and gloo), :mod:`afd_core.runtime.control` (the per-step control channel), :mod:`afd_core.runtime.p2p`
and :mod:`afd_core.runtime.expert` (the role endpoints), :mod:`afd_core.runtime.world` (rendezvous and
transports). Importing this package imports neither torch nor a connector module: the
registry loads connectors lazily by ``"module:Class"``.
"""
