"""Attention-FFN Disaggregation (AFD) for vLLM: the core every AFD package builds on.

Three layers, told apart by their folders:

* **The contract**: what role packages and third-party connectors import, grouped by
  topic. :mod:`~afd_core.config` (``AFDConfig``, its coercion, the stage planner, partial
  configs); :mod:`~afd_core.wire` (step metadata, the control and header codecs, the one
  header writer); :mod:`~afd_core.dataplane` (the transport, op-provider and replay-guard
  contracts); :mod:`~afd_core.plugins` (hook specs, specs, plugin manager, registry);
  :mod:`~afd_core.kit` (the pattern kit: the rules every exchange pattern keeps). Beside
  them, one module each: the connector and endpoint contracts
  (:mod:`~afd_core.connector`), what a connector can carry and the one check of a
  deployment against it (:mod:`~afd_core.capabilities`), the recipe and the assembly API
  (:mod:`~afd_core.assembly`), the rank map (:mod:`~afd_core.topology`,
  :mod:`~afd_core.placement`), errors and fuses (:mod:`~afd_core.errors`,
  :mod:`~afd_core.failures`) and the ``vllm.general_plugins`` entry point
  (:mod:`~afd_core.vllm_plugin`).
* **The runtime** (:mod:`afd_core.runtime`): rendezvous, store gate, liveness, links,
  the control channel, the exchange patterns, the gloo transport and the assembler that
  builds a connector from its recipe. Internal: it may change in any release; reach it
  through :mod:`afd_core.assembly` and :mod:`afd_core.kit` only.
* **The tools** (:mod:`afd_core.tools`): the ``afd`` command, local deployments, the
  prefill proxy and the demo; and :mod:`afd_core.plan`, the cost model behind ``afd plan``.

Beside them: :mod:`afd_core.workers` (what the role workers share: rank, wire spec,
connector, process exit, profiling ranges), :mod:`afd_core.http_status` and
:mod:`afd_core.metrics` (``GET /afd/status`` and the ``afd:`` metrics on either role's
API server), and :mod:`afd_core.connectors` (the reference ``P2pGlooAFDConnector``, a
recipe like any third-party connector).
"""

__version__ = "0.3.0"

from afd_core.plugins.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
