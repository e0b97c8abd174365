"""The pattern kit: the public parts an exchange pattern is built from.

An exchange pattern (afd-core's P2P and expert-routed ones, the NPU connectors' CAM
patterns, a third party's) pairs attention and FFN ranks and moves each layer's hidden
states between them. The rules every pattern keeps live here once, typed and versioned
with the contract, so that no pattern writes them again:
:mod:`~afd_core.kit.step_exchanges` (every layer and stage of a step exchanged once, in
order), :mod:`~afd_core.kit.in_flight` (each result paired with its send),
:mod:`~afd_core.kit.endpoint_context` (what a transport-plane endpoint is built on) and
:mod:`~afd_core.kit.peer_links` (an FFN endpoint's links to its attention ranks). The
rank pairings themselves are :class:`~afd_core.topology.Topology`'s (``block_of``) and
:mod:`~afd_core.placement`'s (the expert split).
"""
