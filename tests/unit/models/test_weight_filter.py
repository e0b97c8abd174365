"""Which role loads which checkpoint tensor (afd_models.weight_filter; no torch, no vLLM)."""

from __future__ import annotations

import pytest

from afd_models.weight_filter import keep_weight, role_weights, weight_owner

ATTENTION_TENSORS = (
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.norm.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.3.self_attn.q_proj.weight",
    "model.layers.3.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.3.self_attn.kv_a_layernorm.weight",
    "model.layers.3.self_attn.k_norm.weight",
    "model.layers.3.self_attn.indexer.wk.weight",
)

FFN_TENSORS = (
    # routed experts, including quantization scales
    "model.layers.1.mlp.experts.0.gate_proj.weight",
    "model.layers.1.mlp.experts.7.up_proj.weight",
    "model.layers.1.mlp.experts.7.down_proj.weight_scale_inv",
    # shared experts and their gate (Qwen2-MoE style)
    "model.layers.1.mlp.shared_experts.gate_proj.weight",
    "model.layers.1.mlp.shared_expert.down_proj.weight",
    "model.layers.1.mlp.shared_expert_gate.weight",
    # the dense MLP of a dense layer: "gate_proj" is not the router gate
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    # a DeepSeek-V3 multi-token-prediction layer's experts
    "model.layers.61.mlp.experts.3.up_proj.weight",
)

ROUTER_GATE = "model.layers.1.mlp.gate.weight"
ROUTING_BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"


@pytest.mark.parametrize("gate_on_attention", [False, True])
@pytest.mark.parametrize("name", ATTENTION_TENSORS)
def test_embeddings_attention_norms_and_lm_head_belong_to_attention(
    name: str, gate_on_attention: bool
) -> None:
    assert weight_owner(name, gate_on_attention=gate_on_attention) == "attention"


@pytest.mark.parametrize("gate_on_attention", [False, True])
@pytest.mark.parametrize("name", FFN_TENSORS)
def test_experts_shared_experts_and_dense_mlps_belong_to_ffn(
    name: str, gate_on_attention: bool
) -> None:
    assert weight_owner(name, gate_on_attention=gate_on_attention) == "ffn"


def test_router_gate_follows_compute_gate_on_attention() -> None:
    assert weight_owner(ROUTER_GATE, gate_on_attention=True) == "attention"
    assert weight_owner(ROUTER_GATE, gate_on_attention=False) == "ffn"


@pytest.mark.parametrize("gate_on_attention", [False, True])
def test_routing_bias_stays_with_the_router_on_ffn(gate_on_attention: bool) -> None:
    assert weight_owner(ROUTING_BIAS, gate_on_attention=gate_on_attention) == "ffn"


@pytest.mark.parametrize("gate_on_attention", [False, True])
def test_every_tensor_is_kept_by_exactly_one_role(gate_on_attention: bool) -> None:
    for name in (*ATTENTION_TENSORS, *FFN_TENSORS, ROUTER_GATE, ROUTING_BIAS):
        kept_by = [
            role
            for role in ("attention", "ffn")
            if keep_weight(name, role, gate_on_attention=gate_on_attention)
        ]
        assert len(kept_by) == 1, name


def test_role_weights_keeps_the_roles_pairs_in_checkpoint_order() -> None:
    checkpoint = [
        ("model.embed_tokens.weight", 0),
        (ROUTER_GATE, 1),
        ("model.layers.1.mlp.experts.0.up_proj.weight", 2),
        ("model.norm.weight", 3),
        (ROUTING_BIAS, 4),
    ]
    attention = list(role_weights(checkpoint, "attention", gate_on_attention=True))
    ffn = list(role_weights(checkpoint, "ffn", gate_on_attention=True))
    assert attention == [checkpoint[0], checkpoint[1], checkpoint[3]]
    assert ffn == [checkpoint[2], checkpoint[4]]


def test_role_weights_reads_the_checkpoint_lazily() -> None:
    def checkpoint():
        yield "lm_head.weight", 0
        raise AssertionError("read past the first tensor")

    kept = role_weights(checkpoint(), "attention", gate_on_attention=False)
    assert next(kept) == ("lm_head.weight", 0)


def test_unknown_role_is_rejected_at_once() -> None:
    with pytest.raises(ValueError, match="role 'expert' must be one of"):
        keep_weight("lm_head.weight", "expert", gate_on_attention=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="role 'expert' must be one of"):
        role_weights([], "expert", gate_on_attention=False)  # type: ignore[arg-type]
