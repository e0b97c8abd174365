"""The pattern kit: the public parts an exchange pattern is built from.

An exchange pattern (afd-core's P2P and expert-routed ones, the NPU connectors' CAM
patterns, a third party's) pairs attention and FFN ranks and moves each layer's hidden
states between them. The rules every pattern keeps live here once, typed and versioned
with the contract, so that no pattern writes them again:
:mod:`~afd_core.kit.step_exchanges` (every layer and stage of a step exchanged once, in
order), :mod:`~afd_core.kit.in_flight` (each result paired with its send),
:mod:`~afd_core.kit.endpoint_context` (what a transport-plane endpoint is built on),
:mod:`~afd_core.kit.peer_links` (an FFN endpoint's links to its attention ranks),
:mod:`~afd_core.kit.channel` (headed messages between world ranks: sequence numbers,
pending sends, bounded waits and header checks naming both views) and
:mod:`~afd_core.kit.pairing` (the block and all-to-all pairing rules, which
:class:`~afd_core.topology.Topology` answers rank questions through; the expert split
is :mod:`~afd_core.placement`'s). A pattern written on the kit alone, outside
afd-core: ``tests/plugins/afd-example-connector`` (``kit_block``; docs/plugins.md,
"Writing a pattern on the kit").
"""
