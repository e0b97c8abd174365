"""Role-aware Qwen3.5/3.6-MoE: ``AFDQwen3_5MoeForCausalLM`` (text only), registered as
``Qwen3_5MoeForCausalLM``, and ``AFDQwen3_5MoeForConditionalGeneration`` (the multimodal
class released Qwen3.6 checkpoints name), registered as
``Qwen3_5MoeForConditionalGeneration`` and split only when served with
``--language-model-only`` (:mod:`afd_models.language_model_only`): its roles are those of
its ``language_model``, a ``Qwen3_5MoeForCausalLM``.

Every decoder layer has a full-attention (gated GQA) or a linear-attention (Gated
DeltaNet) mixer, chosen by ``config.layer_types``, and every layer has the sparse MoE block
of Qwen3-Next: router gate, routed experts, one shared expert scaled by
``sigmoid(shared_expert_gate(h))``, added up inside vLLM's MoE runner.

* AFD off: exactly vLLM's ``Qwen3_5MoeForCausalLM``.
* attention role: vLLM's ``Qwen3_5MoeForCausalLM.__init__`` (embeddings, both kinds of
  attention with their KV cache and recurrent/conv state, Gemma-style norms, residuals,
  optional layer scales, final norm, ``lm_head``; compiled as usual), built while an
  exchange stands in for ``Qwen3NextSparseMoeBlock``. With ``compute_gate_on_attention``
  the exchange holds the router gate.
* FFN role: the stock ``Qwen3NextSparseMoeBlock`` of every layer (gate, routed experts,
  shared expert and its gate), loaded by ``Qwen3_5Model``'s own loader after the stock
  outer mapper (``model.language_model.`` prefixes stripped, MTP weights dropped). With the
  gate on attention the MoE runner has no gate.

With an expert-routed connector (:mod:`afd_models.routed`) the attention role keeps the
stock MoE blocks (gate, router, shared expert and its gate), with a routed exchange in
place of each MoE runner; each FFN rank holds only the runner of its block of experts.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.fused_moe import GateLinear
from vllm.model_executor.layers.fused_moe.utils import is_model_fused_shared_expert_compatible
from vllm.model_executor.models import qwen3_5 as stock
from vllm.model_executor.models import qwen3_next
from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5Model,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)
from vllm.model_executor.models.qwen3_next import Qwen3NextSparseMoeBlock
from vllm.model_executor.models.utils import extract_layer_index

from afd_models.language_model_only import LanguageModelAttentionRole, LanguageModelFFNRole
from afd_models.layers import ExchangeMLP, FFNStack
from afd_models.role_mixins import FFNRoleMixin, StockAttentionRole
from afd_models.roles import RoleDispatch, afd_config
from afd_models.stock_moe import StockMoEModel, text_config


class AFDQwen3_5MoeForCausalLM(RoleDispatch, Qwen3_5MoeForCausalLM):
    """``Qwen3_5MoeForCausalLM``, or its AFD role class when ``additional_config["afd"]`` is set."""


def _is_moe_layer(config: Any, layer: int) -> bool:
    """Whether decoder layer ``layer`` is sparse (the rule of ``Qwen3_5DecoderLayer``:
    every layer of a ``qwen3_5_moe_text`` model)."""
    return config.model_type == "qwen3_5_moe_text"


class _AttentionSparseMoeBlock(ExchangeMLP):
    """Stands in for ``Qwen3NextSparseMoeBlock`` while the attention role is built."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str, **_stock_kwargs: object) -> None:
        config = text_config(vllm_config)
        gate = None
        afd = afd_config(vllm_config)
        if afd is not None and afd.compute_gate_on_attention:
            # The gate Qwen3NextSparseMoeBlock builds (no quant_config), under the same name.
            gate = GateLinear(config.hidden_size, config.num_experts, prefix=f"{prefix}.gate")
        super().__init__(layer=extract_layer_index(prefix), gate=gate)


def _build_moe_block(vllm_config: VllmConfig, prefix: str) -> Qwen3NextSparseMoeBlock:
    """A ``Qwen3NextSparseMoeBlock`` built as ``Qwen3_5DecoderLayer`` builds it."""
    return Qwen3NextSparseMoeBlock(vllm_config=vllm_config, prefix=prefix)


#: What the role wrappers build Qwen3.5-MoE from (see :mod:`afd_models.stock_moe`): the
#: decoder layers live in ``qwen3_5``, the MoE block (and its ``FusedMoEFactory``) in
#: ``qwen3_next``; no layer is dense. Its gate returns router logits in the model dtype.
STOCK = StockMoEModel(
    module=stock,
    moe_block=Qwen3NextSparseMoeBlock,
    dense_mlp=None,
    attention_moe_block=_AttentionSparseMoeBlock,
    is_moe_layer=_is_moe_layer,
    build_moe_block=_build_moe_block,
    experts_field="num_experts",
    moe_module=qwen3_next,
)


class AttentionQwen3_5MoeForCausalLM(StockAttentionRole, AFDQwen3_5MoeForCausalLM):
    """The attention role of Qwen3.5-MoE (see the module docstring)."""

    afd_stock = STOCK


class _Qwen3_5FFNStack(FFNStack):
    """The FFN role's ``model``; loads with ``Qwen3_5Model``'s own loader and mapper, which
    read the attributes set here as they read them on the stock model."""

    hf_to_vllm_mapper = Qwen3_5Model.hf_to_vllm_mapper
    load_weights = Qwen3_5Model.load_weights

    def __init__(self, vllm_config: VllmConfig, mlps: list[nn.Module]) -> None:
        super().__init__(mlps)
        self.config = text_config(vllm_config)
        self.is_fused_shared_expert_enabled = is_model_fused_shared_expert_compatible(
            self.layers, Qwen3NextSparseMoeBlock, "mlp"
        )


class FFNQwen3_5MoeForCausalLM(FFNRoleMixin, AFDQwen3_5MoeForCausalLM):
    """The FFN role of Qwen3.5-MoE (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        # Builds no embeddings, attention, recurrent state, norms or lm_head.
        nn.Module.__init__(self)
        mlps = self.afd_init_ffn_role(STOCK, vllm_config, prefix)
        self.model = _Qwen3_5FFNStack(vllm_config, mlps)
        # vLLM's MixtureOfExperts fields, as Qwen3_5MoeForCausalLM.__init__ sets them.
        self.afd_set_expert_fields(Qwen3NextSparseMoeBlock)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The stock outer mapper (``Qwen3_5ForCausalLMBase.hf_to_vllm_mapper``: strips
        ``model.language_model.``, drops ``mtp.``), then the FFN role's split and loader."""
        return super().load_weights(self.hf_to_vllm_mapper.apply(weights))


AFDQwen3_5MoeForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionQwen3_5MoeForCausalLM, "ffn": FFNQwen3_5MoeForCausalLM}
)


class AFDQwen3_5MoeForConditionalGeneration(RoleDispatch, Qwen3_5MoeForConditionalGeneration):
    """``Qwen3_5MoeForConditionalGeneration``, or its AFD role class when
    ``additional_config["afd"]`` is set (``--language-model-only`` required)."""


class AttentionQwen3_5MoeForConditionalGeneration(
    LanguageModelAttentionRole, AFDQwen3_5MoeForConditionalGeneration
):
    """The attention role: the stock model around ``AttentionQwen3_5MoeForCausalLM``."""

    afd_text_module = stock
    afd_text_class = Qwen3_5MoeForCausalLM.__name__
    afd_text_wrapper = AFDQwen3_5MoeForCausalLM


class FFNQwen3_5MoeForConditionalGeneration(
    LanguageModelFFNRole, AFDQwen3_5MoeForConditionalGeneration
):
    """The FFN role: ``FFNQwen3_5MoeForCausalLM`` as ``language_model``, nothing else."""

    afd_text_wrapper = AFDQwen3_5MoeForCausalLM


AFDQwen3_5MoeForConditionalGeneration.afd_role_classes = MappingProxyType(
    {
        "attention": AttentionQwen3_5MoeForConditionalGeneration,
        "ffn": FFNQwen3_5MoeForConditionalGeneration,
    }
)
