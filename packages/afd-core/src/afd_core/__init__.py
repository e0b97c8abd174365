"""Attention-FFN Disaggregation (AFD) for vLLM: the core every AFD package builds on.

Two layers, told apart by where they live:

* **The contract** (the modules at this package's top level): what role packages and
  third-party connectors import. Configuration (:mod:`~afd_core.config`), the rank map
  (:mod:`~afd_core.topology`, :mod:`~afd_core.placement`), step metadata and the wire
  spec (:mod:`~afd_core.metadata`, :mod:`~afd_core.wire`), the connector and endpoint
  contracts (:mod:`~afd_core.connector`), what a connector can carry and the one check
  of a deployment against it (:mod:`~afd_core.capabilities`), the data-plane contracts (a
  :mod:`~afd_core.transport` or an :mod:`~afd_core.op_provider`), the recipe a connector
  is built from and the assembly API (:mod:`~afd_core.assembly`), the rules an endpoint
  keeps (:mod:`~afd_core.step_exchanges`, :mod:`~afd_core.in_flight`), what a
  transport-plane endpoint is built on (:mod:`~afd_core.endpoint_context`,
  :mod:`~afd_core.peer_links`), errors and fuses
  (:mod:`~afd_core.errors`, :mod:`~afd_core.failures`), the plugin hooks and registry
  (:mod:`~afd_core.hookspecs`, :mod:`~afd_core.registry`, :mod:`~afd_core.plugins`) and
  the ``vllm.general_plugins`` entry point (:mod:`~afd_core.vllm_plugin`).
* **The runtime** (:mod:`afd_core.runtime`): rendezvous, store gate, liveness, links,
  the control channel, the exchange patterns, the gloo transport and the assembler that
  builds a connector from its recipe. Internal: it may change in any release; reach it
  through :mod:`afd_core.assembly` only.

Beside them: :mod:`afd_core.workers` (what the role workers share: rank, wire spec,
connector, process exit, profiling ranges), :mod:`afd_core.http_status` (``GET
/afd/status`` on either role's API server), :mod:`afd_core.connectors` (the reference
``P2pGlooAFDConnector``, a recipe like any third-party connector), and the tools
:mod:`afd_core.cli` (the ``afd`` command) and :mod:`afd_core.launch` (local
deployments).
"""

__version__ = "0.3.0"

from afd_core.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
