"""DeepSeek-V3.2's registration, tiny-model spec and start-up refusal.

The role models are built from a real checkpoint in tests/e2e_cpu/test_deepseek_v32.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from afd_models.hooks import MODEL_SPECS
from afd_models.tiny.specs import (
    CPU_MLA_LATENT_SIZE,
    DEEPSEEK_V2,
    DEEPSEEK_V32,
    FAMILIES,
    TINY_MODELS,
    VOCAB_SIZE,
)


def test_the_deepseek_v32_wrapper_is_registered_under_the_stock_name() -> None:
    specs = {s.architecture: s.target for s in MODEL_SPECS}
    assert specs["DeepseekV32ForCausalLM"] == "afd_models.deepseek_v32:AFDDeepseekV32ForCausalLM"


def test_the_tiny_deepseek_v32_model_is_its_own_family_with_the_indexer_and_v3_routing() -> None:
    assert FAMILIES["deepseek_v32"] == {DEEPSEEK_V32.name: DEEPSEEK_V32}
    assert DEEPSEEK_V32.name not in TINY_MODELS
    DEEPSEEK_V32.check_cpu_constraints(VOCAB_SIZE)
    config = DEEPSEEK_V32.config
    # vLLM builds the indexer when the config has index_topk, and needs a query LoRA.
    assert config["index_topk"] and config["q_lora_rank"]
    assert DEEPSEEK_V32.attention_head_size == CPU_MLA_LATENT_SIZE
    # DeepSeek-V3's router: sigmoid scores, routing bias, routed scaling != 1.
    assert (config["topk_method"], config["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert config["routed_scaling_factor"] != 1
    # A dense first layer, as in DeepSeek-V2's tiny model.
    assert config["first_k_dense_replace"] == DEEPSEEK_V2.config["first_k_dense_replace"] == 1


def _vllm_config(tensor_parallel_size: int) -> SimpleNamespace:
    return SimpleNamespace(
        parallel_config=SimpleNamespace(tensor_parallel_size=tensor_parallel_size)
    )


@pytest.mark.parametrize(
    ("generic", "refused"), [(False, True), (True, False)], ids=["cuda-rocm-class", "deepseek_v2"]
)
def test_attention_tensor_parallelism_is_refused_only_on_the_cuda_and_rocm_classes(
    monkeypatch: pytest.MonkeyPatch, generic: bool, refused: bool
) -> None:
    pytest.importorskip("vllm")
    from afd_core.errors import AFDConfigError
    from afd_models import deepseek_v32

    monkeypatch.setattr(deepseek_v32, "GENERIC_DSA", generic)
    deepseek_v32.check_attention_parallelism(_vllm_config(1))
    if not refused:
        deepseek_v32.check_attention_parallelism(_vllm_config(2))
        return
    refusal = r"tensor_parallel_size \(2\) must be 1 .* add attention ranks"
    with pytest.raises(AFDConfigError, match=refusal):
        deepseek_v32.check_attention_parallelism(_vllm_config(2))
