"""Role-aware DeepSeek-V2/V3: ``AFDDeepseekV2ForCausalLM`` and ``AFDDeepseekV3ForCausalLM``,
registered as ``DeepseekV2ForCausalLM`` and ``DeepseekV3ForCausalLM``.

* AFD off: exactly vLLM's classes.
* attention role: vLLM's ``DeepseekV2ForCausalLM.__init__`` (embeddings, MLA attention,
  norms, residuals, final norm, ``lm_head``; compiled as usual), built while an exchange
  stands in for ``DeepseekV2MoE`` and ``DeepseekV2MLP``, so every decoder layer (the dense
  first ``first_k_dense_replace`` ones too) exchanges. With ``compute_gate_on_attention``
  the exchange of an MoE layer holds the router gate.
* FFN role: the stock ``DeepseekV2MoE`` (gate, routed and shared experts) or
  ``DeepseekV2MLP`` of every layer, loaded by DeepSeek's own hand-rolled loader. With the
  gate on attention the MoE runner has no gate but keeps the V3 routing bias.

With an expert-routed connector (:mod:`afd_models.routed`) the attention role keeps the
stock ``DeepseekV2MoE`` blocks (gate, routing bias, router, shared experts) and the dense
first layers, with a routed exchange in place of each MoE runner; each FFN rank holds
only the runner of its block of routed experts.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from vllm._aiter_ops import rocm_aiter_ops
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.model_executor.layers.fused_moe import GateLinear
from vllm.model_executor.layers.fused_moe.utils import is_model_fused_shared_expert_compatible
from vllm.model_executor.models import deepseek_v2 as stock
from vllm.model_executor.models.deepseek_v2 import (
    DeepseekV2ForCausalLM,
    DeepseekV2MLP,
    DeepseekV2Model,
    DeepseekV2MoE,
    DeepseekV3ForCausalLM,
    _get_moe_router_dtype,
)
from vllm.model_executor.models.utils import extract_layer_index, maybe_prefix

from afd_core.config import AFDConfig
from afd_core.connector import WireSpec
from afd_core.placement import ExpertPlacement
from afd_models.layers import (
    DenseExchangeMLP,
    ExchangeMLP,
    FFNStack,
    NoMLP,
    check_attention_stack,
    check_routed_attention_stack,
    detach_gate,
    stand_ins,
)
from afd_models.role_mixins import AttentionRoleMixin, FFNRoleMixin
from afd_models.roles import (
    RoleDispatch,
    afd_config,
    clear_moe_attributes,
    ffn_role_rank,
    make_wire_spec,
)
from afd_models.routed import LocalExperts, local_experts_factory, routed_exchange_factory


class AFDDeepseekV2ForCausalLM(RoleDispatch, DeepseekV2ForCausalLM):
    """``DeepseekV2ForCausalLM``, or its AFD role class when ``additional_config["afd"]`` is set."""


class AFDDeepseekV3ForCausalLM(RoleDispatch, DeepseekV3ForCausalLM):
    """``DeepseekV3ForCausalLM``, or its AFD role class when ``additional_config["afd"]`` is set."""


def _is_moe_layer(config: Any, layer: int) -> bool:
    """Whether decoder layer ``layer`` is sparse (the rule of ``DeepseekV2DecoderLayer``)."""
    return (
        config.n_routed_experts is not None
        and layer >= config.first_k_dense_replace
        and layer % getattr(config, "moe_layer_freq", 1) == 0
    )


def _placement(vllm_config: VllmConfig, afd: AFDConfig) -> ExpertPlacement | None:
    """The expert blocks of an expert-routed deployment, else None."""
    if afd.exchange != "expert":
        return None
    return ExpertPlacement(vllm_config.model_config.hf_config.n_routed_experts, afd.num_ffn_ranks)


def _wire_spec(vllm_config: VllmConfig, afd: AFDConfig) -> WireSpec:
    config = vllm_config.model_config.hf_config
    return make_wire_spec(
        vllm_config,
        afd,
        num_layers=config.num_hidden_layers,
        num_experts=config.n_routed_experts or 0,
        top_k=config.num_experts_per_tok or 0,
        # DeepseekV2MoE's gate returns router_dtype, or the model dtype when unset.
        router_logits_dtype=_get_moe_router_dtype(config) or vllm_config.model_config.dtype,
        dense_layers=tuple(
            layer for layer in range(config.num_hidden_layers) if not _is_moe_layer(config, layer)
        ),
    )


class _AttentionMoE(ExchangeMLP):
    """Stands in for ``DeepseekV2MoE`` while the attention role is built."""

    def __init__(self, *, config: Any, prefix: str, **_stock_kwargs: object) -> None:
        gate = None
        afd = afd_config(get_current_vllm_config())
        if afd is not None and afd.compute_gate_on_attention:
            # The gate DeepseekV2MoE builds, under the same name; the routing bias of
            # noaux_tc models stays with the router on the FFN role.
            gate = GateLinear(
                config.hidden_size,
                config.n_routed_experts,
                out_dtype=_get_moe_router_dtype(config),
                prefix=f"{prefix}.gate",
            )
        super().__init__(layer=extract_layer_index(prefix), gate=gate)


class _DeepseekAttentionRole(AttentionRoleMixin):
    """The attention role of DeepSeek-V2/V3 (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        afd = afd_config(vllm_config)
        placement = _placement(vllm_config, afd)
        wire = _wire_spec(vllm_config, afd)
        if placement is not None:
            with stand_ins(stock, FusedMoEFactory=routed_exchange_factory):
                super().__init__(vllm_config=vllm_config, prefix=prefix)
            check_routed_attention_stack(
                self.model.layers, wire.exchange_layers, type(self).__name__
            )
        else:
            with stand_ins(stock, DeepseekV2MoE=_AttentionMoE, DeepseekV2MLP=DenseExchangeMLP):
                super().__init__(vllm_config=vllm_config, prefix=prefix)
            check_attention_stack(self.model.layers, type(self).__name__)
        self.afd = afd
        self.afd_wire = wire
        self.afd_placement = placement

    def set_moe_parameters(self) -> None:
        """Called by the stock ``__init__``: no local experts on the attention role."""
        clear_moe_attributes(self)


class _DeepseekFFNStack(FFNStack):
    """The FFN role's ``model``; loads with ``DeepseekV2Model``'s own (hand-rolled)
    loader, which reads the attributes set here as it reads them on the stock model."""

    load_weights = DeepseekV2Model.load_weights

    def __init__(self, vllm_config: VllmConfig, mlps: list[nn.Module]) -> None:
        super().__init__(mlps)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.use_mha = config.model_type == "deepseek" or all(
            getattr(config, dim, 0) == 0 for dim in ("qk_nope_head_dim", "qk_rope_head_dim")
        )
        self.num_redundant_experts = vllm_config.parallel_config.eplb_config.num_redundant_experts
        self.is_fused_shared_expert_enabled = is_model_fused_shared_expert_compatible(
            self.layers, DeepseekV2MoE, "mlp"
        )


class _DeepseekFFNRole(FFNRoleMixin):
    """The FFN role of DeepSeek-V2/V3 (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        # Builds no embeddings, attention, norms or lm_head.
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.afd = afd_config(vllm_config)
        self.afd_wire = _wire_spec(vllm_config, self.afd)
        self.afd_placement = _placement(vllm_config, self.afd)
        if self.afd_placement is not None:
            self.afd_ffn_rank = ffn_role_rank(vllm_config, self.afd)
        self.routed_scaling_factor = getattr(config, "routed_scaling_factor", 1.0)
        layers_prefix = f"{maybe_prefix(prefix, 'model')}.layers"
        mlps = [
            self._build_mlp(vllm_config, layer, f"{layers_prefix}.{layer}.mlp")
            for layer in range(config.num_hidden_layers)
        ]
        self.model = _DeepseekFFNStack(vllm_config, mlps)
        self.set_moe_parameters()

    def _build_mlp(self, vllm_config: VllmConfig, layer: int, prefix: str) -> nn.Module:
        """The block ``DeepseekV2DecoderLayer`` builds for ``layer``, same arguments
        (expert-routed: only the runner of this rank's experts, nothing for dense layers)."""
        config = self.config
        placement = self.afd_placement
        if placement is not None:
            if not _is_moe_layer(config, layer):
                return NoMLP()
            local = local_experts_factory(len(placement.block(self.afd_ffn_rank)))
            with stand_ins(stock, FusedMoEFactory=local):
                block = self._stock_moe(vllm_config, prefix)
            return LocalExperts(block.experts)
        if not _is_moe_layer(config, layer):
            return DeepseekV2MLP(
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                hidden_act=config.hidden_act,
                quant_config=self.quant_config,
                prefix=prefix,
            )
        block = self._stock_moe(vllm_config, prefix)
        if self.afd.compute_gate_on_attention:
            detach_gate(block)
        return block

    def _stock_moe(self, vllm_config: VllmConfig, prefix: str) -> DeepseekV2MoE:
        """A ``DeepseekV2MoE`` built as ``DeepseekV2DecoderLayer`` builds it."""
        return DeepseekV2MoE(
            config=self.config,
            parallel_config=vllm_config.parallel_config,
            quant_config=self.quant_config,
            prefix=prefix,
            apply_routed_scale_to_output=not rocm_aiter_ops.is_fused_moe_enabled(),
        )

    def set_moe_parameters(self) -> None:
        """vLLM's MixtureOfExperts fields, as the stock ``set_moe_parameters`` sets them
        (expert-routed: for this rank's experts)."""
        if self.afd_placement is not None:
            local = [
                layer.mlp for layer in self.model.layers if isinstance(layer.mlp, LocalExperts)
            ]
            count = len(self.afd_placement.block(self.afd_ffn_rank))
            self.moe_mlp_layers = local
            self.moe_layers = [block.experts for block in local]
            self.num_moe_layers = len(local)
            self.num_expert_groups = 1
            self.num_shared_experts = 0
            self.num_logical_experts = self.num_physical_experts = count
            self.num_local_physical_experts = self.num_routed_experts = count
            self.num_redundant_experts = 0
            return
        self.num_expert_groups = getattr(self.config, "n_group", 1)
        self.moe_mlp_layers = [
            layer.mlp for layer in self.model.layers if isinstance(layer.mlp, DeepseekV2MoE)
        ]
        self.moe_layers = [moe.experts for moe in self.moe_mlp_layers]
        self.num_moe_layers = len(self.moe_mlp_layers)
        self.extract_moe_parameters(self.moe_mlp_layers[-1] if self.moe_mlp_layers else None)

    def afd_finish_block(self, mlp: nn.Module, output: torch.Tensor) -> torch.Tensor:
        """DeepseekV2DecoderLayer scales a dense MLP's fp16 output (overflow guard)."""
        if isinstance(mlp, DeepseekV2MLP) and output.dtype == torch.float16:
            output *= 1.0 / self.routed_scaling_factor
        return output


class AttentionDeepseekV2ForCausalLM(_DeepseekAttentionRole, AFDDeepseekV2ForCausalLM):
    """The attention role of DeepSeek-V2."""


class FFNDeepseekV2ForCausalLM(_DeepseekFFNRole, AFDDeepseekV2ForCausalLM):
    """The FFN role of DeepSeek-V2."""


class AttentionDeepseekV3ForCausalLM(_DeepseekAttentionRole, AFDDeepseekV3ForCausalLM):
    """The attention role of DeepSeek-V3."""


class FFNDeepseekV3ForCausalLM(_DeepseekFFNRole, AFDDeepseekV3ForCausalLM):
    """The FFN role of DeepSeek-V3."""


AFDDeepseekV2ForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionDeepseekV2ForCausalLM, "ffn": FFNDeepseekV2ForCausalLM}
)
AFDDeepseekV3ForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionDeepseekV3ForCausalLM, "ffn": FFNDeepseekV3ForCausalLM}
)
