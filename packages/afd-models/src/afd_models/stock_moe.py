"""What the MoE role wrappers share, written once: a :class:`StockMoEModel` per vLLM model.

A wrapper (:mod:`afd_models.qwen3_moe`, :mod:`afd_models.deepseek_v2`) describes the stock
vLLM model module it builds from: its MoE block and dense MLP classes, the rule that makes
a decoder layer sparse, how the stock decoder layer builds its MoE block, and where the
Hugging Face config keeps the number of routed experts. From that, identically for every
model, come the wire spec, the expert placement of an expert-routed deployment, the
stand-ins the attention role is built under and the MLP the FFN role holds for each
decoder layer. What differs between models (the gate the attention role builds, the
loader, vLLM's MixtureOfExperts fields) stays in the wrappers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig

from afd_core.config import AFDConfig
from afd_core.connector import WireSpec
from afd_core.errors import AFDInstallError
from afd_core.placement import ExpertPlacement
from afd_models.layers import DenseExchangeMLP, NoMLP, detach_gate, stand_ins
from afd_models.roles import make_wire_spec
from afd_models.routed import LocalExperts, local_experts_factory, routed_exchange_factory


def text_config(vllm_config: VllmConfig) -> Any:
    """The Hugging Face config of the language model (``model_config.hf_text_config``)."""
    return vllm_config.model_config.hf_text_config


def logits_in_model_dtype(config: Any) -> torch.dtype | None:
    """For a gate that returns router logits in the model dtype: None."""
    return None


@dataclass(frozen=True)
class StockMoEModel:
    """One stock vLLM MoE model module, as the role wrappers build from it.

    ``module`` is the vLLM model module (stand-ins are put there, under the names of the
    classes they replace); ``moe_block`` and ``dense_mlp`` its MoE block and dense MLP
    classes, ``attention_moe_block`` the
    attention role's stand-in for ``moe_block`` (an ExchangeMLP taking the stock keyword
    arguments); ``dense_mlp`` is None for a model whose every decoder layer is sparse
    (Qwen3.5-MoE). ``is_moe_layer(config, layer)`` is the stock decoder layer's rule;
    ``build_moe_block(vllm_config, prefix)`` builds ``moe_block`` as the stock decoder
    layer does. ``experts_field`` names the config field holding the number of routed
    experts. ``hf_config`` picks the model's Hugging Face config out of the VllmConfig;
    ``router_dtype(config)`` is the dtype of the stock gate's logits (None: the model
    dtype). ``moe_module`` is the vLLM module whose ``FusedMoEFactory`` builds the MoE
    runner, when ``moe_block`` comes from another module than ``module`` (None: ``module``).
    """

    module: ModuleType
    moe_block: type[nn.Module]
    dense_mlp: type[nn.Module] | None
    attention_moe_block: type[nn.Module]
    is_moe_layer: Callable[[Any, int], bool]
    build_moe_block: Callable[[VllmConfig, str], nn.Module]
    experts_field: str
    hf_config: Callable[[VllmConfig], Any] = text_config
    router_dtype: Callable[[Any], torch.dtype | None] = logits_in_model_dtype
    moe_module: ModuleType | None = None

    @property
    def factory_module(self) -> ModuleType:
        """The module whose ``FusedMoEFactory`` the MoE block calls."""
        return self.moe_module or self.module

    def num_experts(self, config: Any) -> int:
        """Routed experts per MoE layer (0 for a config without any)."""
        return getattr(config, self.experts_field) or 0

    def wire_spec(self, vllm_config: VllmConfig, afd: AFDConfig) -> WireSpec:
        """The wire spec of this checkpoint (both roles compute the same)."""
        config = self.hf_config(vllm_config)
        layers = range(config.num_hidden_layers)
        return make_wire_spec(
            vllm_config,
            afd,
            num_layers=config.num_hidden_layers,
            num_experts=self.num_experts(config),
            top_k=config.num_experts_per_tok or 0,
            router_logits_dtype=self.router_dtype(config) or vllm_config.model_config.dtype,
            dense_layers=tuple(layer for layer in layers if not self.is_moe_layer(config, layer)),
        )

    def placement(self, vllm_config: VllmConfig, afd: AFDConfig) -> ExpertPlacement | None:
        """The expert blocks of an expert-routed deployment, else None."""
        if afd.expert_placement is None:
            return None
        config = self.hf_config(vllm_config)
        return ExpertPlacement(self.num_experts(config), afd.num_ffn_ranks, afd.expert_placement)

    def attention_stand_ins(
        self, placement: ExpertPlacement | None
    ) -> AbstractContextManager[None]:
        """The stand-ins the attention role's stock model is built under: a routed
        exchange in place of each MoE runner (expert-routed, ``placement`` given), else
        an exchange in place of every MoE block and dense MLP."""
        if placement is not None:
            return stand_ins(self.factory_module, FusedMoEFactory=routed_exchange_factory)
        replacements: dict[str, Callable[..., nn.Module]] = {
            self.moe_block.__name__: self.attention_moe_block
        }
        if self.dense_mlp is not None:
            replacements[self.dense_mlp.__name__] = DenseExchangeMLP
        return stand_ins(self.module, **replacements)

    def ffn_mlp(
        self,
        vllm_config: VllmConfig,
        afd: AFDConfig,
        placement: ExpertPlacement | None,
        ffn_rank: int,
        layer: int,
        prefix: str,
    ) -> nn.Module:
        """The FFN role's ``mlp`` of decoder ``layer``: the block the stock decoder layer
        builds, with the same arguments (its gate detached when the gate runs on the
        attention role); expert-routed, only the runner of FFN rank ``ffn_rank``'s block
        of experts, and nothing for a dense layer."""
        config = self.hf_config(vllm_config)
        moe = self.is_moe_layer(config, layer)
        if placement is not None:
            if not moe:
                return NoMLP()
            local = local_experts_factory(len(placement.block(ffn_rank)))
            with stand_ins(self.factory_module, FusedMoEFactory=local):
                block = self.build_moe_block(vllm_config, prefix)
            return LocalExperts(block.experts)
        if not moe:
            if self.dense_mlp is None:
                raise AFDInstallError(
                    f"AFD: layer {layer} of {self.module.__name__} is dense, but afd-models "
                    "knows no dense MLP class of that model; install the vLLM version "
                    "afd-models supports (0.32)"
                )
            return self.dense_mlp(
                hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                hidden_act=config.hidden_act,
                quant_config=vllm_config.quant_config,
                prefix=prefix,
            )
        block = self.build_moe_block(vllm_config, prefix)
        if afd.compute_gate_on_attention:
            detach_gate(block)
        return block
