"""The AFD runtime: what runs under a connector's contract. Internal to afd-core.

Connectors and role packages never import from here; they describe a connector as a
recipe and build it through :mod:`afd_core.assembly`. What lives here:

* :mod:`~afd_core.runtime.rendezvous`, :mod:`~afd_core.runtime.store_gate`: the
  store-based rendezvous (FFN rank 0 hosts it) and the secret in front of it;
* :mod:`~afd_core.runtime.world`, :mod:`~afd_core.runtime.links`,
  :mod:`~afd_core.runtime.seats`: the layouts (one world of every rank, or a link per
  attention rank and FFN rank) and attention ranks that come and go;
* :mod:`~afd_core.runtime.liveness`: heartbeat connections to every peer;
* :mod:`~afd_core.runtime.control`: the per-step control channel and the FFN step relays;
* :mod:`~afd_core.runtime.gloo`: the gloo transport;
* the exchange patterns: :mod:`~afd_core.runtime.p2p` (block) and
  :mod:`~afd_core.runtime.expert` (expert-routed M:N);
* :mod:`~afd_core.runtime.assembler`: builds any connector from its recipe.
"""
