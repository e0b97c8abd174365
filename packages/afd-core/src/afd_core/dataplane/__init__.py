"""The data-plane contracts: how a connector's bytes move between the roles.

A connector's data plane is one of two kinds. A :mod:`~afd_core.dataplane.transport`
moves one tensor to or from one peer (gloo in afd-core, NCCL in afd-connectors-gpu); an
:mod:`~afd_core.dataplane.op_provider` hands out custom ops that communicate inside
themselves, on groups named by a string (afd-ascend-ops). CUDA graph steps of a
transport plane are checked once per step by a :mod:`~afd_core.dataplane.replay_guard`.
"""
