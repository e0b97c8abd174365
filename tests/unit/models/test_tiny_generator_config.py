"""The tiny-model specs, sharpness and FFN-dependence criteria (pure: no torch, no transformers)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from afd_models.tiny.generate import TinyModelReport
from afd_models.tiny.measure import Margin
from afd_models.tiny.specs import (
    CPU_ATTENTION_HEAD_SIZES,
    CPU_MLA_LATENT_SIZE,
    DEEPSEEK_V2,
    MEASURED_TOKENS,
    MIN_FFN_TOKEN_SHARE,
    MIN_GAP_NATS,
    PROMPTS,
    QWEN3_MOE,
    TINY_MODELS,
    VOCAB_SIZE,
    WIDE_MODELS,
)


def _with(spec, **changes):
    return dataclasses.replace(spec, config={**spec.config, **changes})


@pytest.mark.parametrize(
    "spec", [*TINY_MODELS.values(), *WIDE_MODELS.values()], ids=[*TINY_MODELS, *WIDE_MODELS]
)
def test_every_tiny_model_fits_vllm_cpu(spec):
    spec.check_cpu_constraints(tokenizer_size=VOCAB_SIZE)


def test_the_wide_family_has_the_held_out_shapes_and_the_tiny_models_sharpening():
    for wide, tiny in zip(WIDE_MODELS.values(), TINY_MODELS.values(), strict=True):
        cfg = wide.config
        routed = cfg.get("num_experts", cfg.get("n_routed_experts"))
        assert (cfg["hidden_size"], cfg["moe_intermediate_size"]) == (256, 128)
        assert (routed, cfg["num_experts_per_tok"]) == (16, 4)
        assert wide.architecture == tiny.architecture and wide.name.startswith("wide-")
        assert (wide.lm_head_scale, wide.expert_spread) == (tiny.lm_head_scale, tiny.expert_spread)
    assert WIDE_MODELS["wide-qwen3-moe"].attention_head_size == 64
    assert not set(WIDE_MODELS) & set(TINY_MODELS)


def test_qwen3_moe_uses_a_cpu_attention_head_size_and_gqa():
    assert QWEN3_MOE.attention_head_size in CPU_ATTENTION_HEAD_SIZES
    assert not QWEN3_MOE.uses_mla
    cfg = QWEN3_MOE.config
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert (cfg["num_experts"], cfg["num_experts_per_tok"]) == (8, 2)
    assert 2 <= cfg["num_hidden_layers"] <= 4


def test_deepseek_v2_has_the_cpu_mla_latent_size_a_dense_first_layer_and_a_shared_expert():
    assert DEEPSEEK_V2.uses_mla
    assert DEEPSEEK_V2.attention_head_size == CPU_MLA_LATENT_SIZE
    cfg = DEEPSEEK_V2.config
    assert cfg["first_k_dense_replace"] == 1 < cfg["num_hidden_layers"]
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]) == (
        8,
        2,
        1,
    )


def test_mla_latent_size_other_than_576_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"is 96, but the CPU MLA backend needs 576; use 512"):
        _with(DEEPSEEK_V2, kv_lora_rank=64, qk_rope_head_dim=32).check_cpu_constraints(100)


def test_attention_head_size_unsupported_by_cpu_attention_is_rejected():
    spec = _with(QWEN3_MOE, head_dim=48, hidden_size=192)
    with pytest.raises(ValueError, match="head_dim 48 is not one of the CPU attention"):
        spec.check_cpu_constraints(100)


def test_tokenizer_larger_than_the_vocabulary_is_rejected():
    with pytest.raises(ValueError, match=f"vocab_size {VOCAB_SIZE} is smaller than the tokenizer"):
        QWEN3_MOE.check_cpu_constraints(VOCAB_SIZE + 1)


def test_top_k_not_below_the_expert_count_is_rejected():
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in 1\.\.7"):
        _with(QWEN3_MOE, num_experts_per_tok=8).check_cpu_constraints(100)


def test_hf_config_kwargs_add_vocab_token_ids_and_turn_tuples_into_lists():
    kwargs = QWEN3_MOE.hf_config_kwargs(bos_id=0, eos_id=0, pad_id=3)
    assert kwargs["vocab_size"] == VOCAB_SIZE
    assert (kwargs["bos_token_id"], kwargs["eos_token_id"], kwargs["pad_token_id"]) == (0, 0, 3)
    assert kwargs["mlp_only_layers"] == []
    assert kwargs["tie_word_embeddings"] is False
    assert kwargs["hidden_size"] == QWEN3_MOE.config["hidden_size"]


def test_tests_have_prompts_and_enough_measured_tokens():
    assert len(PROMPTS) >= 4 and len(set(PROMPTS)) == len(PROMPTS)
    assert MEASURED_TOKENS >= 16


def _margin(**changes) -> Margin:
    sharp = Margin(
        min_gap_nats=10.0,
        max_bf16_shift_nats=0.1,
        mean_ffn_shift_nats=1.0,
        ffn_changed_tokens=60,
        distinct_tokens=90,
        continuations=tuple(tuple(range(24)) for _ in range(4)),
    )
    return dataclasses.replace(sharp, **changes)


def test_a_sharp_margin_has_no_shortfalls():
    assert _margin().shortfalls() == []
    assert _margin().margin_ratio == pytest.approx(100.0)


def test_a_gap_below_the_threshold_is_a_shortfall_even_if_noise_is_tiny():
    found = _margin(min_gap_nats=MIN_GAP_NATS / 2, max_bf16_shift_nats=1e-4).shortfalls()
    assert len(found) == 1 and "top-1/top-2 gap" in found[0]


def test_a_gap_that_bf16_noise_could_close_is_a_shortfall():
    found = _margin(min_gap_nats=2.0, max_bf16_shift_nats=1.0, mean_ffn_shift_nats=10.0)
    assert [s for s in found.shortfalls() if "bf16 shift" in s]


def test_an_ffn_that_barely_moves_the_logits_is_a_shortfall():
    found = _margin(mean_ffn_shift_nats=0.2).shortfalls()
    assert len(found) == 1 and "without FFN" in found[0]


def test_at_least_a_third_of_the_greedy_tokens_must_depend_on_the_ffn():
    assert pytest.approx(1 / 3) == MIN_FFN_TOKEN_SHARE
    assert _margin(ffn_changed_tokens=32).shortfalls() == []  # 32 of 96: exactly a third
    found = _margin(ffn_changed_tokens=31).shortfalls()
    assert found == ["zeroing the FFN changes 31 of 96 greedy tokens (32%) < 33%"]


def test_a_model_whose_tokens_ignore_the_ffn_is_refused_however_sharp():
    # The review's case: sharp margins, a visible FFN shift, but no token changes.
    found = _margin(min_gap_nats=12.49, mean_ffn_shift_nats=2.11, ffn_changed_tokens=0)
    assert [s for s in found.shortfalls() if "zeroing the FFN changes 0 of 96" in s]


def test_the_summary_line_prints_the_share_of_tokens_the_ffn_decides():
    report = TinyModelReport(
        name="tiny-x",
        path=Path("/models/tiny-x"),
        architecture="X",
        weight_seed=0,
        attempts=1,
        num_parameters=1_000_000,
        tokenizer_size=VOCAB_SIZE,
        margin=_margin(ffn_changed_tokens=57),
        sha256="0" * 64,
        seconds=1.0,
    )
    assert "FFN zeroed: 57 of 96 tokens changed (59%)" in report.summary()


def test_expert_spread_outside_zero_to_one_is_rejected():
    with pytest.raises(ValueError, match=r"expert_spread is 0, but must be in \(0, 1\]"):
        dataclasses.replace(QWEN3_MOE, expert_spread=0)
    with pytest.raises(ValueError, match=r"expert_spread is 1.5"):
        dataclasses.replace(QWEN3_MOE, expert_spread=1.5)


def test_importing_the_tiny_package_loads_no_torch():
    code = (
        "import sys, afd_models.tiny, afd_models.tiny.generate, afd_models.tiny.__main__; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
