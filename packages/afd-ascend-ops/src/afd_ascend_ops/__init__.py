"""The ``a2e``/``e2a`` and CAM dispatch/combine operators of Attention-FFN Disaggregation
(AFD) as ``torch.ops.afd_ascend`` ops, with CPU reference kernels. torch comes from the
environment; importing this package imports none.

* :mod:`afd_ascend_ops.schemas`: the op schemas (pure);
* :mod:`afd_ascend_ops.ops`: importing it defines and registers the ops (imports torch);
* :mod:`afd_ascend_ops.fake`: their fake (meta) kernels;
* :mod:`afd_ascend_ops.reference`: the CPU reference data plane (groups over gloo, their
  kernels) and :class:`~afd_ascend_ops.reference.ReferenceOpProvider`;
* :mod:`afd_ascend_ops.registry`: the process-local registry of named groups (pure);
* :mod:`afd_ascend_ops.header`: the header of every reference message (pure).
"""

__version__ = "0.3.0"
