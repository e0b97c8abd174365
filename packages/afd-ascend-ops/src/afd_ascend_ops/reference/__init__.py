"""The CPU reference data plane of the ``afd_ascend`` ops: groups over gloo, their kernels
and :class:`ReferenceOpProvider`, the op provider that opens and registers them.

Importing this package imports no torch; opening a provider registers the ops.
"""

from afd_ascend_ops.reference.provider import ReferenceOpProvider

__all__ = ["ReferenceOpProvider"]
