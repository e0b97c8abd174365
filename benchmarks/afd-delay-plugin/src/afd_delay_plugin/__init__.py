"""A benchmark's third-party AFD plugin: ``DelayedGlooP2pConnector``.

The reference P2P connector's recipe with its gloo data plane wrapped in
:class:`~afd_delay_plugin.delaying.DelayingTransport`, which holds every data message for
``connector_extra_config.delay_us`` microseconds before it goes on the wire, as a link
with that latency would. ``benchmarks/afd_overlap_cpu.py`` uses it to measure how much of
an exchange's latency two stages per step hide (docs/performance.md). Not for serving.
"""

__version__ = "0.1.0"
