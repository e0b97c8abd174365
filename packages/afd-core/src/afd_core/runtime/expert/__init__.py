"""The expert-routed M:N exchange: routed experts split over the FFN ranks in blocks.

* :mod:`afd_core.placement`: which FFN rank holds which experts (pure, contract);
* :mod:`~afd_core.runtime.expert.routing`: rows per FFN rank, local expert ids, the combine;
* :mod:`~afd_core.runtime.expert.messages`: the packed body of an attention-to-FFN message;
* :mod:`~afd_core.runtime.expert.attention` and :mod:`~afd_core.runtime.expert.ffn`: the
  endpoints.

:data:`EXPERT_ROUTED` is the pattern a recipe names (:mod:`afd_core.assembly`): every
attention rank exchanges with every FFN rank; the attention ranks announce their steps
to FFN rank 0, which relays them to the other FFN ranks
(:mod:`~afd_core.runtime.control.relay`), so every FFN rank runs every step. It runs on
a transport plane, in either layout. This is the seam for other dispatch/combine
backends: a DeepEP or NVSHMEM backend would be another pattern with the same pairing
and its own endpoint pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from afd_core.assembly import AttentionSide, FFNSide, Pattern, RuntimeSpec, TransportPlane
from afd_core.config.partials import partials_dtype, wire_dtype
from afd_core.placement import ExpertPlacement

if TYPE_CHECKING:
    from afd_core.runtime.expert.attention import ExpertAttentionEndpoint
    from afd_core.runtime.expert.ffn import ExpertFFNEndpoint


class ExpertRouted(Pattern):
    """The expert-routed pattern (see the module docstring)."""

    name: ClassVar[str] = "expert-routed"
    expert_placement = "balanced"
    gate_on_attention = True
    gate_reason = (
        "routes every token to the FFN ranks that hold its experts, so the router runs on "
        "the attention role"
    )
    data_plane = TransportPlane
    relays_steps = True

    def check(self, spec: RuntimeSpec) -> None:
        """The wire spec's routing must fit a message body (AFDConfigError otherwise)."""
        from afd_core.runtime.expert.messages import check_packable

        check_packable(spec.wire)

    def attention_endpoint(self, side: AttentionSide) -> ExpertAttentionEndpoint:
        from afd_core.runtime.expert.attention import ExpertAttentionEndpoint, FFNPeer

        topology = side.spec.topology
        placement = ExpertPlacement(
            side.spec.wire.num_experts, topology.num_ffn_ranks, self.expert_placement
        )
        peers = tuple(FFNPeer(p.transport, p.transport_rank, p.failures) for p in side.peers)
        return ExpertAttentionEndpoint(
            side.transport_context(),
            placement=placement,
            ffn_peers=peers,
            control=side.announcer,  # type: ignore[arg-type]
            partials=partials_wire_dtype(side.spec),
        )

    def ffn_endpoint(self, side: FFNSide) -> ExpertFFNEndpoint:
        from afd_core.runtime.expert.ffn import ExpertFFNEndpoint

        topology = side.spec.topology
        placement = ExpertPlacement(
            side.spec.wire.num_experts, topology.num_ffn_ranks, self.expert_placement
        )
        return ExpertFFNEndpoint(
            side.transport_context(),
            block=placement.block(side.spec.role_rank),
            links=side.links,
            relay=side.steps,  # type: ignore[arg-type]
            partials=partials_wire_dtype(side.spec),
        )


def partials_wire_dtype(spec: RuntimeSpec) -> str:
    """The wire dtype of the FFN ranks' partial results: the model's, or float32 with
    ``partials_dtype`` ``"float32"`` (:mod:`afd_core.config.partials`)."""
    return wire_dtype(partials_dtype(spec.config.connector_extra_config), spec.wire.dtype)


#: The expert-routed pattern.
EXPERT_ROUTED = ExpertRouted()
