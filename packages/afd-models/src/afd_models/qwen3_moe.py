"""Role-aware Qwen3-MoE: ``AFDQwen3MoeForCausalLM``, registered as ``Qwen3MoeForCausalLM``.

* AFD off: exactly vLLM's ``Qwen3MoeForCausalLM``.
* attention role: vLLM's ``Qwen3MoeModel`` (embeddings, attention, norms, residuals,
  final norm; compiled as usual) and ``lm_head``, with an exchange in place of every
  decoder layer's MLP (holding the router gate when ``compute_gate_on_attention``).
* FFN role: the stock ``Qwen3MoeSparseMoeBlock`` / ``Qwen3MoeMLP`` of every layer,
  nothing else (the MoE runner has no gate when the gate runs on attention).

With an expert-routed connector (:mod:`afd_models.routed`) the attention role keeps the
stock MoE blocks (gate, router, shared expert) and dense MLPs, with a routed exchange in
place of each MoE runner; each FFN rank holds only the runner of its block of experts.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.fused_moe import GateLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models import qwen3_moe as stock
from vllm.model_executor.models.qwen3_moe import (
    Qwen3MoeForCausalLM,
    Qwen3MoeMLP,
    Qwen3MoeModel,
    Qwen3MoeSparseMoeBlock,
)
from vllm.model_executor.models.utils import extract_layer_index, maybe_prefix

from afd_models.layers import ExchangeMLP, FFNStack, check_attention_role
from afd_models.role_mixins import AttentionRoleMixin, FFNRoleMixin
from afd_models.roles import RoleDispatch, afd_config, clear_moe_attributes
from afd_models.stock_moe import StockMoEModel


class AFDQwen3MoeForCausalLM(RoleDispatch, Qwen3MoeForCausalLM):
    """``Qwen3MoeForCausalLM``, or its AFD role class when ``additional_config["afd"]`` is set."""


def _is_moe_layer(config: Any, layer: int) -> bool:
    """Whether decoder layer ``layer`` is sparse (the rule of ``Qwen3MoeDecoderLayer``)."""
    mlp_only_layers = getattr(config, "mlp_only_layers", [])
    return (
        layer not in mlp_only_layers
        and config.num_experts > 0
        and (layer + 1) % config.decoder_sparse_step == 0
    )


class _AttentionSparseMoeBlock(ExchangeMLP):
    """Stands in for ``Qwen3MoeSparseMoeBlock`` while the attention role is built."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str, **_stock_kwargs: object) -> None:
        config = vllm_config.model_config.hf_text_config
        gate = None
        afd = afd_config(vllm_config)
        if afd is not None and afd.compute_gate_on_attention:
            # The gate Qwen3MoeSparseMoeBlock builds, under the same name.
            gate = GateLinear(
                config.hidden_size,
                config.num_experts,
                quant_config=vllm_config.quant_config,
                prefix=f"{prefix}.gate",
            )
        super().__init__(layer=extract_layer_index(prefix), gate=gate)


def _build_moe_block(vllm_config: VllmConfig, prefix: str) -> Qwen3MoeSparseMoeBlock:
    """A ``Qwen3MoeSparseMoeBlock`` built as ``Qwen3MoeDecoderLayer`` builds it."""
    return Qwen3MoeSparseMoeBlock(vllm_config=vllm_config, prefix=prefix)


#: What the role wrappers build Qwen3-MoE from (see :mod:`afd_models.stock_moe`); its gate
#: (GateLinear without out_dtype) returns router logits in the model dtype.
STOCK = StockMoEModel(
    module=stock,
    moe_block=Qwen3MoeSparseMoeBlock,
    dense_mlp=Qwen3MoeMLP,
    attention_moe_block=_AttentionSparseMoeBlock,
    is_moe_layer=_is_moe_layer,
    build_moe_block=_build_moe_block,
    experts_field="num_experts",
)


class AttentionQwen3MoeForCausalLM(AttentionRoleMixin, AFDQwen3MoeForCausalLM):
    """The attention role of Qwen3-MoE (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        # Not Qwen3MoeForCausalLM.__init__: its MoE bookkeeping requires local MoE
        # blocks. The parts built here are the stock ones, with the stock arguments.
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.afd = afd_config(vllm_config)
        self.afd_wire = STOCK.wire_spec(vllm_config, self.afd)
        self.afd_placement = STOCK.placement(vllm_config, self.afd)
        with STOCK.attention_stand_ins(self.afd_placement):
            self.model = Qwen3MoeModel(
                vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model")
            )
        routed_layers = None if self.afd_placement is None else self.afd_wire.exchange_layers
        check_attention_role(self.model.layers, "Qwen3MoeForCausalLM", routed_layers)
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=self.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        clear_moe_attributes(self)


class _Qwen3FFNStack(FFNStack):
    """The FFN role's ``model``; loads with ``Qwen3MoeModel``'s own loader and mapper."""

    hf_to_vllm_mapper = Qwen3MoeModel.hf_to_vllm_mapper
    load_weights = Qwen3MoeModel.load_weights


class FFNQwen3MoeForCausalLM(FFNRoleMixin, AFDQwen3MoeForCausalLM):
    """The FFN role of Qwen3-MoE (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        # Builds no embeddings, attention, norms or lm_head.
        nn.Module.__init__(self)
        self.model = _Qwen3FFNStack(self.afd_init_ffn_role(STOCK, vllm_config, prefix))
        # vLLM's MixtureOfExperts fields, as Qwen3MoeForCausalLM.__init__ sets them.
        self.afd_set_expert_fields(Qwen3MoeSparseMoeBlock)


AFDQwen3MoeForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionQwen3MoeForCausalLM, "ffn": FFNQwen3MoeForCausalLM}
)
