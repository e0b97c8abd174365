"""An example third-party AFD connector package (see docs/plugins.md).

Its ``afd`` entry point points at :mod:`afd_example_connector.hooks`, which registers
``ExampleLoopbackConnector`` lazily; :mod:`afd_example_connector.connector` holds the class.
"""

__version__ = "0.1.0"
