"""An example third-party AFD connector package (see docs/plugins.md and README.md).

Its ``afd`` entry point points at :mod:`afd_example_connector.hooks`, which registers three
connectors lazily:

* ``ExampleGlooP2pConnector`` (:mod:`afd_example_connector.gloo_p2p`): a connector that
  is a recipe of afd-core's assembly API, with a transport decorator of its own
  (:mod:`afd_example_connector.byte_counting`);
* ``ExampleKitPatternConnector`` (:mod:`afd_example_connector.kit_block`): a recipe
  whose pattern is this package's own, written on afd-core's pattern kit
  (:mod:`afd_core.kit`);
* ``ExampleLoopbackConnector`` (:mod:`afd_example_connector.connector`): a connector that
  builds its own endpoints in ``connect()``.
"""

__version__ = "0.1.0"
