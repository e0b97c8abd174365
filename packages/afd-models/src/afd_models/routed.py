"""The MoE layers of an expert-routed deployment: the router on attention, expert blocks on FFN.

With an expert-routed connector (``AFDConfig.splits_experts``) the role wrappers
build the stock MoE block on both roles with vLLM's ``FusedMoEFactory`` replaced:

* **attention role**: :func:`routed_exchange_factory` returns a :class:`RoutedExchange`
  in place of the MoE runner. It holds what the runner would hold except the routed
  experts: the gate, vLLM's own router (built by ``create_fused_moe_router`` from the
  very arguments the stock block passes), the shared experts; its forward is the stock
  runner's (``MoERunner.forward`` on a single rank): shared experts, routing, the routed
  experts (here: ``torch.ops.afd.exchange_experts``, which sends each token to the FFN
  ranks holding its experts and adds up their partial results), the routed scaling
  factor, then shared + routed. Dense MLPs and shared experts are computed here, once
  per token, with no wire round trip: they are dense (every token needs them, so no
  routing applies) and small next to the routed experts (DeepSeek-V3: 1 shared expert
  and 3 dense layers against 256 routed experts in 58 layers).
* **FFN role**: :func:`local_experts_factory` builds the stock runner for the rank's
  block of experts only (``num_experts`` = the block size, no gate, no shared experts, no
  routed scaling: those live on attention); :func:`compute_local_experts` runs vLLM's
  expert kernels on received rows with the routing the attention rank chose. With
  ``partials_dtype`` ``"float32"`` (:mod:`afd_core.config.partials`) it runs the reference
  expert path instead (:func:`keep_reference_weights` at load time): float32 accumulation
  up to the output, rounding only where vLLM's CPU expert kernel rounds (the intermediate
  activation, to the model dtype), and a float32 result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from vllm.model_executor.layers.fused_moe import FusedMoEFactory
from vllm.model_executor.layers.fused_moe.layer import determine_expert_counts
from vllm.model_executor.layers.fused_moe.router.router_factory import create_fused_moe_router
from vllm.model_executor.models.utils import extract_layer_index

import afd_models.exchange_op  # noqa: F401  (registers torch.ops.afd.exchange_experts)
from afd_core.connector import ExpertRouting
from afd_core.errors import AFDInstallError

#: ``FusedMoEFactory`` features the expert-routed roles do not split (none of the
#: supported models uses them on their supported platforms).
_UNSUPPORTED = (
    "fuse_shared_experts",
    "zero_expert_type",
    "hash_indices_table",
    "routed_input_transform",
    "routed_output_transform",
    "shared_expert_gate",
    "enable_eplb",
)


def _refuse_unsupported(kwargs: dict[str, Any], prefix: str) -> None:
    used = [key for key in _UNSUPPORTED if kwargs.get(key)]
    if used:
        raise AFDInstallError(
            f"AFD: the MoE layer {prefix} uses {', '.join(used)}, which the expert-routed "
            "connector does not split between the roles yet; use a P2P connector"
        )


class RoutedExchange(nn.Module):
    """The attention role's stand-in for vLLM's MoE runner (see the module docstring).

    ``forward(hidden_states, router_logits)`` has the runner's signature; like the
    stock runner that holds its gate, it ignores ``router_logits`` (the stock blocks pass
    the hidden states there) and computes them with its gate.
    """

    def __init__(
        self,
        *,
        layer: int,
        gate: nn.Module,
        router: nn.Module,
        shared_experts: nn.Module | None,
        routed_scaling_factor: float,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.gate = gate
        self.router = router
        self.shared_experts = shared_experts
        self.routed_scaling_factor = routed_scaling_factor

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        logits, _ = self.gate(hidden_states)
        shared = None if self.shared_experts is None else self.shared_experts(hidden_states)
        topk_weights, topk_ids = self.router.select_experts(
            hidden_states=hidden_states, router_logits=logits
        )
        routed = torch.ops.afd.exchange_experts(hidden_states, topk_weights, topk_ids, self.layer)
        # MoERunner._maybe_apply_routed_scale_to_output, then the shared + routed sum.
        if self.routed_scaling_factor != 1.0:
            if routed.dtype != torch.float16 or shared is None:
                routed = routed * self.routed_scaling_factor
            else:
                shared = shared * (1.0 / self.routed_scaling_factor)
        return routed if shared is None else shared + routed


def routed_exchange_factory(**kwargs: Any) -> RoutedExchange:
    """Stands in for ``FusedMoEFactory`` on the attention role (same keyword arguments)."""
    prefix = kwargs.get("prefix", "")
    _refuse_unsupported(kwargs, prefix)
    gate = kwargs.get("gate")
    if gate is None:
        raise AFDInstallError(
            f"AFD: the MoE layer {prefix} gives its runner no gate; the expert-routed "
            "connector needs the gate on the attention role"
        )
    global_experts, logical_experts, _ = determine_expert_counts(
        kwargs["num_experts"], kwargs.get("num_redundant_experts", 0), None, False
    )
    scale = kwargs.get("routed_scaling_factor", 1.0)
    scale_output = kwargs.get("apply_routed_scale_to_output", False)
    # FusedMoEFactory builds its router with exactly these values.
    router = create_fused_moe_router(
        top_k=kwargs["top_k"],
        global_num_experts=global_experts,
        eplb_state=None,
        renormalize=kwargs.get("renormalize", True),
        use_grouped_topk=kwargs.get("use_grouped_topk", False),
        num_expert_group=kwargs.get("num_expert_group"),
        topk_group=kwargs.get("topk_group"),
        custom_routing_function=kwargs.get("custom_routing_function"),
        scoring_func=kwargs.get("scoring_func", "softmax"),
        routed_scaling_factor=1.0 if scale_output else scale,
        e_score_correction_bias=kwargs.get("e_score_correction_bias"),
        num_fused_shared_experts=0,
        num_logical_experts=logical_experts,
    )
    return RoutedExchange(
        layer=extract_layer_index(prefix),
        gate=gate,
        router=router,
        shared_experts=kwargs.get("shared_experts"),
        routed_scaling_factor=scale if scale_output else 1.0,
    )


def local_experts_factory(num_local_experts: int) -> Callable[..., nn.Module]:
    """Stands in for ``FusedMoEFactory`` on an FFN rank holding ``num_local_experts``."""

    def factory(**kwargs: Any) -> nn.Module:
        _refuse_unsupported(kwargs, kwargs.get("prefix", ""))
        local = dict(
            kwargs,
            num_experts=num_local_experts,
            gate=None,
            shared_experts=None,
            e_score_correction_bias=None,
            routed_scaling_factor=1.0,
            apply_routed_scale_to_output=False,
        )
        return FusedMoEFactory(**local)

    return factory


class LocalExperts(nn.Module):
    """An FFN rank's MoE block: only ``experts`` (the runner of its block of experts).

    ``reference``: copies of the expert weights as loaded (``w13``, ``w2``), kept for the
    float32 reference path (:func:`keep_reference_weights`), else None.
    """

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        self.experts = experts
        self.reference: tuple[torch.Tensor, torch.Tensor] | None = None


def keep_reference_weights(block: LocalExperts) -> None:
    """Keep copies of ``block``'s expert weights as loaded (before vLLM repacks them for its
    kernel), for :func:`compute_local_experts` in float32. AFDInstallError for an
    activation the reference path does not have (it has SiLU-and-multiply, the
    activation of every supported model)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    routed = block.experts.routed_experts
    if routed.activation is not MoEActivation.SILU:
        raise AFDInstallError(
            f"AFD: partials_dtype float32 computes the experts with SiLU-and-multiply, but "
            f'this MoE layer uses {routed.activation}; use partials_dtype "model"'
        )
    block.reference = (routed.w13_weight.detach().clone(), routed.w2_weight.detach().clone())


def compute_local_experts(
    block: LocalExperts, hidden: torch.Tensor, routing: ExpertRouting
) -> torch.Tensor:
    """Run the routed experts of ``block`` on ``hidden`` with ``routing``.

    ``routing`` holds local expert ids (int32) and float32 weights, ``[rows, top_k]``
    (weight 0 for slots whose expert lives on another rank). Returns the weighted sum of
    the rank's experts per row: from vLLM's kernels in the model dtype, or, when the block
    keeps reference weights, from the float32 reference path in float32.
    """
    if block.reference is not None:
        return experts_in_float32(block.reference, hidden, routing)
    routed = block.experts.routed_experts
    quant_method = routed.quant_method
    if quant_method.moe_quant_config is None:  # built after loading, as the runner does
        quant_method.moe_quant_config = quant_method.get_fused_moe_quant_config(routed)
    return routed.forward_modular(
        x=hidden, topk_weights=routing.topk_weights, topk_ids=routing.topk_ids
    )


def experts_in_float32(
    weights: tuple[torch.Tensor, torch.Tensor], hidden: torch.Tensor, routing: ExpertRouting
) -> torch.Tensor:
    """Each expert's SiLU MLP in float32 (the intermediate activation rounded to the model
    dtype, as vLLM's CPU kernel rounds it), weighted and summed per row in float32."""
    w13, w2 = weights
    intermediate = w2.shape[2]
    x = hidden.float()
    out = torch.zeros((hidden.shape[0], w2.shape[1]), dtype=torch.float32, device=x.device)
    ids, scale = routing.topk_ids.long(), routing.topk_weights.float()
    for expert in torch.unique(ids[scale != 0]).tolist():
        rows, slots = ((ids == expert) & (scale != 0)).nonzero(as_tuple=True)
        gate_up = x[rows] @ w13[expert].float().t()
        gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
        activation = (torch.nn.functional.silu(gate) * up).to(hidden.dtype).float()
        out.index_add_(0, rows, (activation @ w2[expert].float().t()) * scale[rows, slots, None])
    return out
