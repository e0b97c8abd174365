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
from typing import Any, ClassVar

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
from vllm.model_executor.models.utils import extract_layer_index

from afd_models.layers import ExchangeMLP, FFNStack
from afd_models.role_mixins import FFNRoleMixin, StockAttentionRole
from afd_models.roles import RoleDispatch, afd_config
from afd_models.stock_moe import StockMoEModel


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


def build_moe_block(
    vllm_config: VllmConfig, prefix: str, *, apply_routed_scale_to_output: bool | None = None
) -> DeepseekV2MoE:
    """A ``DeepseekV2MoE`` built as ``DeepseekV2DecoderLayer`` builds it, its results
    reduced over tensor parallel ranks. ``apply_routed_scale_to_output``: None for the
    stock layer's choice (off only where ROCm AITER's fused MoE applies the scale)."""
    if apply_routed_scale_to_output is None:
        apply_routed_scale_to_output = not rocm_aiter_ops.is_fused_moe_enabled()
    return DeepseekV2MoE(
        config=vllm_config.model_config.hf_config,
        parallel_config=vllm_config.parallel_config,
        quant_config=vllm_config.quant_config,
        prefix=prefix,
        apply_routed_scale_to_output=apply_routed_scale_to_output,
    )


#: What the role wrappers build DeepSeek-V2/V3 from (see :mod:`afd_models.stock_moe`).
STOCK = StockMoEModel(
    module=stock,
    moe_block=DeepseekV2MoE,
    dense_mlp=DeepseekV2MLP,
    attention_moe_block=_AttentionMoE,
    is_moe_layer=_is_moe_layer,
    build_moe_block=build_moe_block,
    experts_field="n_routed_experts",
    hf_config=lambda vllm_config: vllm_config.model_config.hf_config,
    # DeepseekV2MoE's gate returns router_dtype, or the model dtype when unset.
    router_dtype=_get_moe_router_dtype,
)


class DeepseekAttentionRole(StockAttentionRole):
    """The attention role of DeepSeek-V2/V3 (see the module docstring); also that of
    DeepSeek-V3.2 (:mod:`afd_models.deepseek_v32`), built from its own ``afd_stock``."""

    afd_stock: ClassVar[StockMoEModel] = STOCK


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


class DeepseekFFNRole(FFNRoleMixin):
    """The FFN role of DeepSeek-V2/V3 (see the module docstring); also that of
    DeepSeek-V3.2, built from its own ``afd_stock``.

    ``afd_scales_fp16_dense``: whether the stock decoder layer scales a dense MLP's fp16
    output by ``1 / routed_scaling_factor`` (``DeepseekV2DecoderLayer`` does).
    """

    afd_stock: ClassVar[StockMoEModel] = STOCK
    afd_scales_fp16_dense: ClassVar[bool] = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        # Builds no embeddings, attention, norms or lm_head.
        nn.Module.__init__(self)
        mlps = self.afd_init_ffn_role(self.afd_stock, vllm_config, prefix)
        self.routed_scaling_factor = getattr(self.config, "routed_scaling_factor", 1.0)
        self.model = _DeepseekFFNStack(vllm_config, mlps)
        self.set_moe_parameters()

    def set_moe_parameters(self) -> None:
        """vLLM's MixtureOfExperts fields, as the stock ``set_moe_parameters`` sets them
        (expert-routed: for this rank's experts)."""
        if self.afd_placement is not None:
            self.moe_mlp_layers = self.afd_set_local_expert_fields()
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
        fp16_dense = isinstance(mlp, DeepseekV2MLP) and output.dtype == torch.float16
        if fp16_dense and self.afd_scales_fp16_dense:
            output *= 1.0 / self.routed_scaling_factor
        return output


class AttentionDeepseekV2ForCausalLM(DeepseekAttentionRole, AFDDeepseekV2ForCausalLM):
    """The attention role of DeepSeek-V2."""


class FFNDeepseekV2ForCausalLM(DeepseekFFNRole, AFDDeepseekV2ForCausalLM):
    """The FFN role of DeepSeek-V2."""


class AttentionDeepseekV3ForCausalLM(DeepseekAttentionRole, AFDDeepseekV3ForCausalLM):
    """The attention role of DeepSeek-V3."""


class FFNDeepseekV3ForCausalLM(DeepseekFFNRole, AFDDeepseekV3ForCausalLM):
    """The FFN role of DeepSeek-V3."""


AFDDeepseekV2ForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionDeepseekV2ForCausalLM, "ffn": FFNDeepseekV2ForCausalLM}
)
AFDDeepseekV3ForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionDeepseekV3ForCausalLM, "ffn": FFNDeepseekV3ForCausalLM}
)
