"""The final hidden state of every token run alone, computed in float64 from the weights.

:mod:`afd_models.tiny.sharpen` builds the lm_head from these states, and the lm_head is
saved in bf16: computed in fp32, the states would differ in their last bits between CPUs
(vectorised kernels sum in a different order on AVX2 and AVX-512), and a few lm_head
values would round to the other bf16 neighbour, so the checkpoint would not be the same
on every machine. In float64 those differences are some 1e-16 of a value, and rounding
to bf16 turns them into the same bytes everywhere.

Transformers computes norms and routers in fp32 whatever the model dtype, so this is
the forward of the tiny architectures written out for one token at position 0,
where attention is simple: the token attends only to itself (weight 1) and rotary
embedding is the identity, so the attention output is ``o_proj`` of the values (times
the output gate of Qwen3.5's gated attention). A Gated DeltaNet layer (Qwen3.5) starts
from a zero state, so its output is ``beta * v * (q . k)`` per head (q and k
l2-normalised, q scaled by ``1/sqrt(head_k_dim)``), its causal convolution sees only the
last kernel tap, and its gated norm scales by ``silu(z)``.
:func:`final_hidden_alone` checks the result against transformers' own fp32 forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Routers without a ``norm_topk_prob`` attribute that renormalise their top-k weights
# (transformers' Qwen3.5-MoE router always does; DeepSeek-V2's never does).
RENORMALIZING_ROUTERS = ("Qwen3_5MoeTopKRouter",)

# Largest accepted 1 - cosine between a float64 state and transformers' fp32 one: fp32
# rounding is some 1e-7 of a value, a different model would be far off.
MAX_FP32_DISAGREEMENT = 1e-4


def final_hidden_alone(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """float64 [len(ids), hidden_size]: the final (normed) hidden state of each token alone.

    ``model``: a Qwen3-MoE, DeepSeek-V2/V3.2 or Qwen3.5-MoE causal LM of transformers
    (SiLU MLPs; softmax top-k routing, or DeepSeek-V3's sigmoid scores with a routing bias
    and expert groups). Raises RuntimeError when the result disagrees with
    transformers' fp32 forward, i.e. when this module no longer matches the model code.
    """
    import torch

    if model.config.hidden_act != "silu":
        raise RuntimeError(f"hidden_act {model.config.hidden_act!r}: only silu is written out")
    decoder = model.model
    with torch.no_grad():
        x = _f64(decoder.embed_tokens.weight)[ids]
        for layer in decoder.layers:
            x = x + _mixer(layer, _rms(layer.input_layernorm, x))
            x = x + _ffn(layer.mlp, _rms(layer.post_attention_layernorm, x))
        states = _rms(decoder.norm, x)
        reference = decoder(input_ids=ids[:, None]).last_hidden_state[:, 0].double()
    disagreement = float((1 - torch.cosine_similarity(states, reference, dim=1)).max())
    if disagreement > MAX_FP32_DISAGREEMENT:
        raise RuntimeError(
            f"afd_models.tiny.alone: float64 final hidden states differ from transformers' "
            f"(1 - cosine {disagreement:.2e} > {MAX_FP32_DISAGREEMENT}); the model code "
            "changed, update afd_models/tiny/alone.py to match it"
        )
    return states


def _f64(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().double()


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ _f64(weight).T


def _rms(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm; Qwen3.5's (``eps``, no ``variance_epsilon``) scales by ``1 + weight``."""
    import torch

    if hasattr(norm, "variance_epsilon"):
        eps, weight = norm.variance_epsilon, _f64(norm.weight)
    else:
        eps, weight = norm.eps, 1 + _f64(norm.weight)
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _mixer(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The token mixer of a decoder layer: Gated DeltaNet or attention."""
    if hasattr(layer, "linear_attn"):
        return _gated_delta_net(layer.linear_attn, x)
    return _attention(layer.self_attn, x)


def _gated_delta_net(gdn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Qwen3.5's linear attention on one token from a zero state (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    if gdn.conv1d.bias is not None:
        raise RuntimeError("afd_models.tiny.alone: a conv1d bias is not written out")
    mixed = F.silu(_linear(x, gdn.in_proj_qkv.weight) * _f64(gdn.conv1d.weight)[:, 0, -1])
    q, k, v = torch.split(mixed, [gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
    heads = len(x), -1
    q, k = (t.reshape(*heads, gdn.head_k_dim) for t in (q, k))
    v = v.reshape(*heads, gdn.head_v_dim)
    repeat = gdn.num_v_heads // gdn.num_k_heads
    q, k = (t.repeat_interleave(repeat, dim=1) for t in (q, k))
    q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    beta = _linear(x, gdn.in_proj_b.weight).sigmoid()[..., None]
    out = beta * v * (q * k).sum(-1, keepdim=True) / gdn.head_k_dim**0.5
    norm = gdn.norm
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    z = _linear(x, gdn.in_proj_z.weight).reshape(*heads, gdn.head_v_dim)
    out = _f64(norm.weight) * out * F.silu(z)
    return _linear(out.reshape(len(x), -1), gdn.out_proj.weight)


def _attention(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``o_proj`` of each query head's value (the token's own, attention weight 1)."""
    if hasattr(attn, "kv_b_proj"):  # MLA: values come out of the normed latent
        latent = _linear(x, attn.kv_a_proj_with_mqa.weight)[:, : attn.kv_lora_rank]
        per_head = _linear(_rms(attn.kv_a_layernorm, latent), attn.kv_b_proj.weight)
        per_head = per_head.view(len(x), -1, attn.qk_nope_head_dim + attn.v_head_dim)
        values = per_head[..., attn.qk_nope_head_dim :].reshape(len(x), -1)
    else:  # grouped-query attention: each KV head serves num_key_value_groups query heads
        values = _linear(x, attn.v_proj.weight).view(len(x), -1, attn.head_dim)
        values = values.repeat_interleave(attn.num_key_value_groups, dim=1).reshape(len(x), -1)
        query = _linear(x, attn.q_proj.weight)
        if query.shape[-1] == 2 * values.shape[-1]:  # Qwen3.5: q_proj also gives the output gate
            gate = query.view(len(x), -1, 2 * attn.head_dim)[..., attn.head_dim :]
            values = values * gate.reshape(len(x), -1).sigmoid()
    return _linear(values, attn.o_proj.weight)


def _ffn(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A dense SwiGLU MLP, or a MoE block: routed experts plus any shared experts."""
    import torch
    import torch.nn.functional as F

    if not hasattr(mlp, "experts"):
        gate = _linear(x, mlp.gate_proj.weight)
        return _linear(F.silu(gate) * _linear(x, mlp.up_proj.weight), mlp.down_proj.weight)
    router = mlp.gate
    logits = _linear(x, router.weight)
    bias = getattr(router, "e_score_correction_bias", None)
    if bias is None:
        probs = logits.softmax(dim=-1)
        weights, chosen = torch.topk(probs, router.top_k)
    else:  # DeepSeek-V3/V3.2: sigmoid scores, the bias only picks the experts
        probs = logits.sigmoid()
        chosen = _grouped_topk(router, probs + _f64(bias))
        weights = probs.gather(1, chosen)
    if getattr(router, "norm_topk_prob", type(router).__name__ in RENORMALIZING_ROUTERS):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * getattr(router, "routed_scaling_factor", 1.0)
    routing = torch.zeros_like(probs).scatter(1, chosen, weights)  # [tokens, experts]
    # Every expert on every token (small here), then the routing weights pick and mix.
    gate, up = torch.einsum("eih,th->eti", _f64(mlp.experts.gate_up_proj), x).chunk(2, dim=-1)
    outputs = torch.einsum("ehi,eti->eth", _f64(mlp.experts.down_proj), F.silu(gate) * up)
    out = torch.einsum("te,eth->th", routing, outputs)
    shared = getattr(mlp, "shared_experts", None)
    if shared is not None:
        return out + _ffn(shared, x)
    shared = getattr(mlp, "shared_expert", None)  # Qwen3.5: one, scaled by its own gate
    if shared is not None:
        return out + _linear(x, mlp.shared_expert_gate.weight).sigmoid() * _ffn(shared, x)
    return out


def _grouped_topk(router: torch.nn.Module, scores: torch.Tensor) -> torch.Tensor:
    """The top-k experts among the ``topk_group`` expert groups with the best two scores."""
    import torch

    groups = scores.view(len(scores), router.num_group, -1)
    best = torch.topk(groups.topk(2, dim=-1)[0].sum(-1), router.topk_group, dim=-1)[1]
    keep = torch.zeros_like(groups[..., 0]).scatter(1, best, 1).bool()
    masked = groups.masked_fill(~keep[..., None], float("-inf")).view(len(scores), -1)
    return torch.topk(masked, router.top_k, dim=-1)[1]
