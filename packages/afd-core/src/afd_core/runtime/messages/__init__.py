"""The message forms of the data plane, written once; every exchange pattern uses them.

A data message of an eager step has one of two forms, and a graph step's the third:

* a **frame**: one message holding the 64-byte header and the tensors it describes
  (:mod:`~afd_core.runtime.messages.frames`): P2P messages up to 1 MiB on a host
  transport, the expert-routed attention-to-FFN message on a transport that accepts
  short messages, every expert-routed reply;
* a **header message, then the bare tensors** (:func:`~afd_core.runtime.messages.forms.headed`):
  larger P2P messages, every P2P message on a device transport, the expert-routed
  attention-to-FFN message where sizes must match exactly;
* **bare tensors** (graph steps): no header; the step is checked once, on the control plane.

:mod:`~afd_core.wire.headers` is the one writer and checker of data headers
(:class:`~afd_core.wire.headers.HeaderWriter`): endpoints give layer, stage,
token count and ranks, never header bytes, and a mismatch names both views.
:mod:`~afd_core.runtime.messages.forms` chooses, once per transport, in which order a
rank posts its sends and receives (:func:`~afd_core.runtime.messages.forms.posting_order`).
The byte layouts are in docs/wire-protocol.md.
"""
