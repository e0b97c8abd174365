"""What the tiny test models are: sizes, vLLM-CPU constraints and the sharpness targets.

Pure Python (no torch): the unit tests check these specs without building a model.

The two models are random but *sharp*: greedy decoding must never sit on a near-tie, or
an AFD deployment and a monolithic one could pick different tokens from rounding noise
alone. They are also *FFN-dependent*: without the FFN output most greedy tokens change,
so equal tokens prove the FFN path right, not just the attention path. ``generate``
measures both on :data:`PROMPTS` and refuses a model that falls short of
:data:`MIN_GAP_NATS`, :data:`MIN_MARGIN_RATIO`, :data:`MIN_FFN_EFFECT_RATIO` or
:data:`MIN_FFN_TOKEN_SHARE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

# vllm/v1/attention/backends/cpu_attn.py: CPUAttentionBackend.get_supported_head_sizes.
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vllm/v1/attention/backends/mla/cpu_mla.py: the CPU MLA decode kernel only handles a
# latent cache of kv_lora_rank + qk_rope_head_dim == 576.
CPU_MLA_LATENT_SIZE = 576

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>")
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<pad>"
MAX_POSITION_EMBEDDINGS = 512

# The prompts on which the margin is measured; tests that compare greedy tokens use these
# prompts and at most MEASURED_TOKENS new tokens.
PROMPTS = (
    "the attention rank sends hidden states to the expert rank",
    "hello world, the capital of france is",
    "one two three four five",
    "a router picks two experts for every token",
)
MEASURED_TOKENS = 24

# Smallest accepted top-1 minus top-2 logit gap of the fp32 greedy run, in nats.
MIN_GAP_NATS = 1.0
# Smallest accepted ratio of that gap to the largest change of a gap between fp32 and
# bf16 compute: scaling the lm_head alone raises gaps and rounding noise alike, so the
# ratio is what tells that bf16 rounding cannot flip a greedy token.
MIN_MARGIN_RATIO = 4.0
# Smallest accepted ratio of the mean change of a gap when the FFN outputs are zeroed to
# that bf16 shift: the FFN role must show in the logprobs well above rounding noise.
MIN_FFN_EFFECT_RATIO = 4.0
# Smallest accepted share of the measured greedy tokens that change, on the same prefix,
# when every MLP/MoE output (dense layers and shared experts included) is zeroed.
MIN_FFN_TOKEN_SHARE = 1 / 3
# Weight seeds tried per model (seed, seed + 1, ...) before generation gives up.
MAX_ATTEMPTS = 4


@dataclass(frozen=True)
class TinyModelSpec:
    """One tiny checkpoint.

    ``config``: the Hugging Face config keywords that define the shape (token ids, vocab
    size and rope are added by :meth:`hf_config_kwargs`). ``lm_head_scale``: the norm of
    every lm_head row (the logit of the predicted token is about ``lm_head_scale *
    sqrt(hidden_size)``). ``embedding_scale`` and ``ffn_output_scale``: factors on the
    input embeddings and on every MLP/expert ``down_proj``; together they make what the
    current token contributes to the residual stream outweigh the attention (context),
    and their ratio makes the FFN output the larger part of it. ``expert_spread``: how
    much of its weights each routed expert owns (1: all; below 1 the rest is shared by
    all experts of the layer), so that swapping the k-th and (k+1)-th expert on a router
    near-tie moves the output little (see :mod:`afd_models.tiny.sharpen`).
    """

    name: str
    architecture: str
    config_class: str
    config: Mapping[str, Any]
    lm_head_scale: float
    embedding_scale: float
    ffn_output_scale: float
    expert_spread: float

    def __post_init__(self) -> None:
        if not 0 < self.expert_spread <= 1:
            raise ValueError(
                f"tiny model {self.name}: expert_spread is {self.expert_spread}, but must be "
                "in (0, 1] (1: experts share nothing)"
            )

    @property
    def uses_mla(self) -> bool:
        """The attention is multi-head latent attention (DeepSeek style)."""
        return "kv_lora_rank" in self.config

    @property
    def attention_head_size(self) -> int:
        """The head size vLLM's CPU attention backend sees (the latent size for MLA)."""
        if self.uses_mla:
            return int(self.config["kv_lora_rank"]) + int(self.config["qk_rope_head_dim"])
        return int(self.config["head_dim"])

    def check_cpu_constraints(self, tokenizer_size: int) -> None:
        """Raise ValueError when vllm-cpu 0.32 could not serve this model.

        Checks the attention head size against the CPU backends, that the vocabulary
        holds every tokenizer id, and that the experts and heads divide as configured.
        """
        cfg = self.config
        problems: list[str] = []
        if self.uses_mla:
            if self.attention_head_size != CPU_MLA_LATENT_SIZE:
                problems.append(
                    f"kv_lora_rank + qk_rope_head_dim is {self.attention_head_size}, but the "
                    f"CPU MLA backend needs {CPU_MLA_LATENT_SIZE}; use 512 + 64"
                )
        else:
            if self.attention_head_size not in CPU_ATTENTION_HEAD_SIZES:
                problems.append(
                    f"head_dim {self.attention_head_size} is not one of the CPU attention "
                    f"head sizes {CPU_ATTENTION_HEAD_SIZES}"
                )
            if cfg["hidden_size"] != cfg["num_attention_heads"] * cfg["head_dim"]:
                problems.append("hidden_size must equal num_attention_heads * head_dim")
            if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
                problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if tokenizer_size > VOCAB_SIZE:
            problems.append(
                f"vocab_size {VOCAB_SIZE} is smaller than the tokenizer ({tokenizer_size} "
                "tokens); raise VOCAB_SIZE"
            )
        routed = cfg.get("num_experts", cfg.get("n_routed_experts"))
        if not 0 < cfg["num_experts_per_tok"] < routed:
            problems.append(f"num_experts_per_tok must be in 1..{routed - 1}")
        if problems:
            raise ValueError(f"tiny model {self.name}: " + "; ".join(problems))

    def hf_config_kwargs(self, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
        """All keywords for the Hugging Face config class, token ids included."""
        # Hugging Face configs serialise lists, not tuples.
        shape = {k: list(v) if isinstance(v, tuple) else v for k, v in self.config.items()}
        return {
            **shape,
            "vocab_size": VOCAB_SIZE,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "tie_word_embeddings": False,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        }


QWEN3_MOE = TinyModelSpec(
    name="tiny-qwen3-moe",
    architecture="Qwen3MoeForCausalLM",
    config_class="Qwen3MoeConfig",
    config=MappingProxyType(
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": (),
            "norm_topk_prob": True,
        }
    ),
    lm_head_scale=3.0,
    embedding_scale=24.0,
    ffn_output_scale=384.0,
    # Without a shared part, a router near-tie at the top-2 boundary (rounding decides
    # which expert is second) swaps a large part of the output: bf16 shifts of up to 7
    # nats, and no seed passes the margin ratio.
    expert_spread=0.1,
)

DEEPSEEK_V2 = TinyModelSpec(
    name="tiny-deepseek-v2",
    architecture="DeepseekV2ForCausalLM",
    config_class="DeepseekV2Config",
    config=MappingProxyType(
        {
            "hidden_size": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 3,
            "first_k_dense_replace": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "q_lora_rank": None,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 64,
            "v_head_dim": 32,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": False,
        }
    ),
    lm_head_scale=3.0,
    embedding_scale=24.0,
    ffn_output_scale=384.0,
    # As for Qwen3-MoE: with independent experts a near-tie swap moves the runner-up
    # logprobs by more than the end-to-end tolerance when a step is batched differently.
    expert_spread=0.1,
)

TINY_MODELS: Mapping[str, TinyModelSpec] = MappingProxyType(
    {spec.name: spec for spec in (QWEN3_MOE, DEEPSEEK_V2)}
)

# The wide family: the shapes of the held-out models of the CUDA exactness work (hidden
# 256, head_dim 64, 16 experts top-4, expert width 128), built and sharpened the same
# way. Not built by default: the CUDA end-to-end tests build them (on some AMX hosts
# vllm-cpu's monolithic Qwen3-MoE of this shape dies of SIGILL; docs/testing.md).
WIDE_QWEN3_MOE = replace(
    QWEN3_MOE,
    name="wide-qwen3-moe",
    config=MappingProxyType(
        {
            **QWEN3_MOE.config,
            "hidden_size": 256,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "head_dim": 64,
            "num_experts": 16,
            "num_experts_per_tok": 4,
        }
    ),
)

WIDE_DEEPSEEK_V2 = replace(
    DEEPSEEK_V2,
    name="wide-deepseek-v2",
    config=MappingProxyType(
        {
            **DEEPSEEK_V2.config,
            "hidden_size": 256,
            "intermediate_size": 512,
            "moe_intermediate_size": 128,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            "n_routed_experts": 16,
            "num_experts_per_tok": 4,
        }
    ),
)

WIDE_MODELS: Mapping[str, TinyModelSpec] = MappingProxyType(
    {spec.name: spec for spec in (WIDE_QWEN3_MOE, WIDE_DEEPSEEK_V2)}
)

# Qwen3.5-MoE, text only: Gated DeltaNet (linear attention) layers beside gated
# full-attention layers, every layer with the Qwen3-Next MoE block (8 routed experts
# top-2, one shared expert with its sigmoid gate). Its own family: vLLM's qwen3_5 module
# needs torchvision, which CI's CPU environment lacks (docs/testing.md).
QWEN3_5_MOE = TinyModelSpec(
    name="tiny-qwen3_5-moe",
    architecture="Qwen3_5MoeForCausalLM",
    config_class="Qwen3_5MoeTextConfig",
    config=MappingProxyType(
        {
            "hidden_size": 128,
            "num_hidden_layers": 3,
            "layer_types": ("linear_attention", "full_attention", "linear_attention"),
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "linear_conv_kernel_dim": 4,
            # vllm-cpu's chunked GDN kernel (chunk_gated_delta_rule_cpu) takes head dim
            # 128, that of the released models; 32 fails "Unexpected head dim size".
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_num_key_heads": 1,
            "linear_num_value_heads": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
        }
    ),
    lm_head_scale=3.0,
    embedding_scale=24.0,
    ffn_output_scale=384.0,
    expert_spread=0.1,
)

QWEN3_5_MODELS: Mapping[str, TinyModelSpec] = MappingProxyType({QWEN3_5_MOE.name: QWEN3_5_MOE})


@dataclass(frozen=True)
class LanguageModelOnlyVariant:
    """A multimodal checkpoint around the exact weights of tiny text model ``text``.

    Served with ``--language-model-only``: vLLM builds no vision tower, so the model is the
    text model, as sharp and FFN-dependent as it (the generator copies its measurement).
    ``vision_config``: the tower's Hugging Face config keywords (random seeded weights,
    saved as real checkpoints hold them; its ``out_hidden_size`` is the text model's
    hidden size). ``config_class`` and ``architecture``: the multimodal config and model
    classes of transformers.
    """

    name: str
    architecture: str
    config_class: str
    text: TinyModelSpec
    vision_config: Mapping[str, Any]


# Qwen3.6 checkpoints name Qwen3_5MoeForConditionalGeneration: the tiny Qwen3.5-MoE text
# model as its language model, beside a one-block vision tower.
QWEN3_5_MOE_VL = LanguageModelOnlyVariant(
    name="tiny-qwen3_5-moe-vl",
    architecture="Qwen3_5MoeForConditionalGeneration",
    config_class="Qwen3_5MoeConfig",
    text=QWEN3_5_MOE,
    vision_config=MappingProxyType(
        {
            "depth": 1,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": QWEN3_5_MOE.config["hidden_size"],
            "num_position_embeddings": 64,
        }
    ),
)

#: The variants the generator derives, by family (built after the family's text models).
VARIANTS: Mapping[str, Mapping[str, LanguageModelOnlyVariant]] = MappingProxyType(
    {"qwen3_5": MappingProxyType({QWEN3_5_MOE_VL.name: QWEN3_5_MOE_VL})}
)

# DeepSeek-V3.2 (DSA): DeepSeek-V3's MoE (sigmoid scores, routing bias ``noaux_tc``,
# routed scaling 2.5, one shared expert, a dense first layer) and MLA with a query LoRA,
# plus the lightning indexer of every layer at the released model's indexer shape (64
# heads of 128, top-2048): prompts shorter than ``index_topk`` attend to every token.
# Its own family: vllm-cpu 0.32.0 has no sparse MLA backend (docs/models.md), so only
# CUDA serves it; the generator itself runs on any CPU.
DEEPSEEK_V32 = replace(
    DEEPSEEK_V2,
    name="tiny-deepseek-v32",
    architecture="DeepseekV32ForCausalLM",
    config_class="DeepseekV32Config",
    config=MappingProxyType(
        {
            **DEEPSEEK_V2.config,
            "q_lora_rank": 64,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "routed_scaling_factor": 2.5,
            "norm_topk_prob": True,
            "index_topk": 2048,
            "index_n_heads": 64,
            "index_head_dim": 128,
        }
    ),
)

DEEPSEEK_V32_MODELS: Mapping[str, TinyModelSpec] = MappingProxyType(
    {DEEPSEEK_V32.name: DEEPSEEK_V32}
)

#: Every family the generator builds, by the name ``python -m afd_models.tiny --family``
#: takes; ``"tiny"`` is the default (the CPU suites' models); ``"qwen3_5"`` needs a vLLM
#: environment with torchvision to be served (``nox -s e2e_qwen35``); ``"deepseek_v32"``
#: needs sparse MLA (CUDA).
FAMILIES: Mapping[str, Mapping[str, TinyModelSpec]] = MappingProxyType(
    {
        "tiny": TINY_MODELS,
        "wide": WIDE_MODELS,
        "qwen3_5": QWEN3_5_MODELS,
        "deepseek_v32": DEEPSEEK_V32_MODELS,
    }
)
