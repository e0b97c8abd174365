"""afd-core's own connectors: recipes over the assembly API, like any third-party one.

* :mod:`~afd_core.connectors.gloo`: ``P2pGlooAFDConnector``, the reference connector
  (P2P over gloo, CPU tensors).

A connector here is its recipe (:mod:`afd_core.assembly`) plus its config parsing.
Importing this package imports neither torch nor a connector module: the registry loads
connectors lazily by ``"module:Class"``.
"""
