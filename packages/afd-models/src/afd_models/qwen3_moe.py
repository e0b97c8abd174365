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


def _wire_spec(vllm_config: VllmConfig, afd: AFDConfig) -> WireSpec:
    config = vllm_config.model_config.hf_text_config
    return make_wire_spec(
        vllm_config,
        afd,
        num_layers=config.num_hidden_layers,
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        # GateLinear without out_dtype returns the model dtype.
        router_logits_dtype=vllm_config.model_config.dtype,
        dense_layers=tuple(
            layer for layer in range(config.num_hidden_layers) if not _is_moe_layer(config, layer)
        ),
    )


def _placement(vllm_config: VllmConfig, afd: AFDConfig) -> ExpertPlacement | None:
    """The expert blocks of an expert-routed deployment, else None."""
    if afd.exchange != "expert":
        return None
    config = vllm_config.model_config.hf_text_config
    return ExpertPlacement(config.num_experts, afd.num_ffn_ranks)


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
        self.afd_wire = _wire_spec(vllm_config, self.afd)
        self.afd_placement = _placement(vllm_config, self.afd)
        model_prefix = maybe_prefix(prefix, "model")
        if self.afd_placement is not None:
            with stand_ins(stock, FusedMoEFactory=routed_exchange_factory):
                self.model = Qwen3MoeModel(vllm_config=vllm_config, prefix=model_prefix)
            check_routed_attention_stack(
                self.model.layers, self.afd_wire.exchange_layers, "Qwen3MoeForCausalLM"
            )
        else:
            with stand_ins(
                stock,
                Qwen3MoeSparseMoeBlock=_AttentionSparseMoeBlock,
                Qwen3MoeMLP=DenseExchangeMLP,
            ):
                self.model = Qwen3MoeModel(vllm_config=vllm_config, prefix=model_prefix)
            check_attention_stack(self.model.layers, "Qwen3MoeForCausalLM")
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
        config = vllm_config.model_config.hf_text_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.afd = afd_config(vllm_config)
        self.afd_wire = _wire_spec(vllm_config, self.afd)
        self.afd_placement = _placement(vllm_config, self.afd)
        if self.afd_placement is not None:
            self.afd_ffn_rank = ffn_role_rank(vllm_config, self.afd)
        layers_prefix = f"{maybe_prefix(prefix, 'model')}.layers"
        self.model = _Qwen3FFNStack(
            [
                self._build_mlp(vllm_config, layer, f"{layers_prefix}.{layer}.mlp")
                for layer in range(config.num_hidden_layers)
            ]
        )
        self._set_moe_attributes()

    def _build_mlp(self, vllm_config: VllmConfig, layer: int, prefix: str) -> nn.Module:
        """The block ``Qwen3MoeDecoderLayer`` builds for ``layer``, with the same arguments
        (expert-routed: only the runner of this rank's experts, nothing for dense layers)."""
        config = self.config
        placement = self.afd_placement
        if placement is not None:
            if not _is_moe_layer(config, layer):
                return NoMLP()
            local = local_experts_factory(len(placement.block(self.afd_ffn_rank)))
            with stand_ins(stock, FusedMoEFactory=local):
                block = Qwen3MoeSparseMoeBlock(vllm_config=vllm_config, prefix=prefix)
            return LocalExperts(block.experts)
        if not _is_moe_layer(config, layer):
            return Qwen3MoeMLP(
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                hidden_act=config.hidden_act,
                quant_config=self.quant_config,
                prefix=prefix,
            )
        block = Qwen3MoeSparseMoeBlock(vllm_config=vllm_config, prefix=prefix)
        if self.afd.compute_gate_on_attention:
            detach_gate(block)
        return block

    def _set_moe_attributes(self) -> None:
        """vLLM's MixtureOfExperts fields, as ``Qwen3MoeForCausalLM.__init__`` sets them
        (expert-routed: for this rank's experts)."""
        if self.afd_placement is not None:
            local = [
                layer.mlp for layer in self.model.layers if isinstance(layer.mlp, LocalExperts)
            ]
            count = len(self.afd_placement.block(self.afd_ffn_rank))
            self.moe_layers = [block.experts for block in local]
            self.num_moe_layers = len(local)
            self.num_expert_groups = 1
            self.num_shared_experts = 0
            self.num_logical_experts = self.num_physical_experts = count
            self.num_local_physical_experts = self.num_routed_experts = count
            self.num_redundant_experts = 0
            return
        blocks = [
            layer.mlp
            for layer in self.model.layers
            if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)
        ]
        example = blocks[-1]
        self.moe_layers = [block.experts for block in blocks]
        self.num_moe_layers = len(blocks)
        self.num_expert_groups = 1
        self.num_shared_experts = 0
        self.num_logical_experts = example.n_logical_experts
        self.num_physical_experts = example.n_physical_experts
        self.num_local_physical_experts = example.n_local_physical_experts
        self.num_routed_experts = example.n_routed_experts
        self.num_redundant_experts = example.n_redundant_experts


AFDQwen3MoeForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionQwen3MoeForCausalLM, "ffn": FFNQwen3MoeForCausalLM}
)
