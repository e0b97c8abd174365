"""The FFN server's loops, each calling one :class:`~afd_ffn.loops.compute.LayerCompute`.

* :mod:`~afd_ffn.loops.step_loop`: announced steps, served layer-major (each layer, each
  stage), eagerly or as
* :mod:`~afd_ffn.loops.graph_steps`: one captured CUDA graph per step shape;
* :mod:`~afd_ffn.loops.work_lanes`: in-band work items (no control plane), one thread per
  lane.

:class:`~afd_ffn.server.FFNServer` keeps the life cycle (rendezvous, reconnect, failure)
and picks the loop its connector needs.
"""
