"""Attention-FFN Disaggregation (AFD) for vLLM: the core every AFD package builds on.

Configuration, topology, wire metadata, the connector contract, the plugin hooks
and the ``afd`` command.
"""

__version__ = "0.2.0"

from afd_core.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
