"""Role-aware DeepSeek-V3.2 (DeepSeek Sparse Attention): ``AFDDeepseekV32ForCausalLM``,
registered as ``DeepseekV32ForCausalLM``.

vLLM picks the class per platform (``vllm/models/deepseek_v32/__init__.py``): on CPU and
XPU it is ``deepseek_v2.DeepseekV3ForCausalLM``, whose MLA layers build the lightning
indexer when the config has ``index_topk``; on CUDA and ROCm it is the
``DeepseekV32ForCausalLM`` of ``nvidia/model.py`` or ``amd/model.py``, whose decoder layers
build the same ``DeepseekV2MoE`` and ``DeepseekV2MLP`` with the routed scaling folded into
the routing weights (``apply_routed_scale_to_output=False``) and leave each MLP output
un-reduced over tensor parallel ranks, for the next layer's norm to all-reduce. The
wrapper subclasses the class vLLM serves on this platform; its roles are DeepSeek-V3's
(:mod:`afd_models.deepseek_v2`) built from that platform's model module:

* attention role: the stock ``__init__`` with an exchange standing in for every MLP and
  MoE block: embeddings, MLA with the indexer (``wq_b``, ``wk_weights_proj``, ``k_norm``),
  its K cache and the shared top-k index buffer, norms, residuals, ``lm_head``;
* FFN role: the stock ``DeepseekV2MoE`` (gate, routing bias, routed and shared experts) or
  ``DeepseekV2MLP`` of every layer, built with the platform's arguments but reducing its
  own results: the all-reduce the stock layer leaves to the next norm has no next norm
  on the FFN role.

What crosses the boundary is DeepSeek-V3's: the output of ``post_attention_layernorm``
in, the block's output back; the residual stays on attention.

Refused at start-up: tensor parallelism on the attention role on CUDA and ROCm (the stock
next-layer norm would all-reduce the whole FFN output the exchange returns on every rank).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from types import MappingProxyType

from vllm.config import VllmConfig
from vllm.model_executor.models import deepseek_v2 as generic
from vllm.models import deepseek_v32 as platform_dsa

from afd_core.errors import AFDConfigError
from afd_models import deepseek_v2
from afd_models.deepseek_v2 import DeepseekAttentionRole, DeepseekFFNRole
from afd_models.roles import RoleDispatch
from afd_models.stock_moe import StockMoEModel

#: The class vLLM serves ``DeepseekV32ForCausalLM`` with on this platform.
StockDeepseekV32ForCausalLM = platform_dsa.DeepseekV32ForCausalLM
#: True where that is ``deepseek_v2``'s DeepSeek-V3 class (CPU, XPU).
GENERIC_DSA = StockDeepseekV32ForCausalLM is generic.DeepseekV3ForCausalLM


class AFDDeepseekV32ForCausalLM(RoleDispatch, StockDeepseekV32ForCausalLM):  # type: ignore[misc,valid-type]
    """vLLM's ``DeepseekV32ForCausalLM`` of this platform, or its AFD role class when
    ``additional_config["afd"]`` is set."""


def _dsa_stock() -> StockMoEModel:
    """DeepSeek-V3's description, on the module whose decoder layers build the blocks."""
    if GENERIC_DSA:
        return deepseek_v2.STOCK
    return dataclasses.replace(
        deepseek_v2.STOCK,
        module=sys.modules[StockDeepseekV32ForCausalLM.__module__],
        build_moe_block=functools.partial(
            deepseek_v2.build_moe_block, apply_routed_scale_to_output=False
        ),
        # DeepseekV2MoE (and the FusedMoEFactory it calls) lives in deepseek_v2.
        moe_module=generic,
    )


#: What the role wrappers build DeepSeek-V3.2 from (see :mod:`afd_models.stock_moe`).
STOCK = _dsa_stock()


def check_attention_parallelism(vllm_config: VllmConfig) -> None:
    """Raise AFDConfigError for attention tensor parallelism on the CUDA/ROCm classes."""
    size = vllm_config.parallel_config.tensor_parallel_size
    if GENERIC_DSA or size == 1:
        return
    raise AFDConfigError(
        f"AFD config: tensor_parallel_size ({size}) must be 1 on the attention role of "
        f"DeepSeek-V3.2 ({StockDeepseekV32ForCausalLM.__module__}): its decoder layers "
        "leave each MLP output un-reduced and all-reduce it in the next layer's norm, but "
        "the exchange returns the whole FFN output on every attention rank, so it would "
        "be summed tensor_parallel_size times; add attention ranks (num_attention_ranks) "
        "instead of tensor parallelism"
    )


class AttentionDeepseekV32ForCausalLM(DeepseekAttentionRole, AFDDeepseekV32ForCausalLM):
    """The attention role of DeepSeek-V3.2 (see the module docstring)."""

    afd_stock = STOCK

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        check_attention_parallelism(vllm_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)


class FFNDeepseekV32ForCausalLM(DeepseekFFNRole, AFDDeepseekV32ForCausalLM):
    """The FFN role of DeepSeek-V3.2 (see the module docstring)."""

    afd_stock = STOCK
    # Only deepseek_v2's decoder layer scales a dense MLP's fp16 output.
    afd_scales_fp16_dense = GENERIC_DSA


AFDDeepseekV32ForCausalLM.afd_role_classes = MappingProxyType(
    {"attention": AttentionDeepseekV32ForCausalLM, "ffn": FFNDeepseekV32ForCausalLM}
)
