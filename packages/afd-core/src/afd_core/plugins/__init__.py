"""AFD's plugins: the pluggy hook specs, what a plugin contributes, and how plugins load.

:mod:`~afd_core.plugins.hookspecs` is the contract of every hook;
:mod:`~afd_core.plugins.specs` the records a hook returns (connectors, role workers,
model wrappers); :mod:`~afd_core.plugins.manager` loads the ``afd`` entry points into one
plugin manager per process; :mod:`~afd_core.plugins.registry` looks names up in what they
registered. afd-core's own contributions (:mod:`~afd_core.plugins.builtin_hooks`) come
through the same hooks as a third party's.
"""
