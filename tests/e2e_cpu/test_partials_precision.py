"""The float32 expert path of ``partials_dtype: "float32"`` (afd_models.routed), checked
against the same math in float64, and what it keeps of the single rounding of a sum
split between FFN ranks.

No servers: the function on seeded random weights. What the option changes end to end,
and how vLLM's CPU expert kernel rounds beside it, is measured in docs/testing.md.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from afd_core.connector import ExpertRouting  # noqa: E402
from afd_models.routed import experts_in_float32  # noqa: E402

E, H, INTER, K, N = 6, 64, 96, 2, 48


def weights_and_routing(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * INTER, H, generator=gen) * 0.1).bfloat16()
    w2 = (torch.randn(E, H, INTER, generator=gen) * 0.1).bfloat16()
    hidden = torch.randn(N, H, generator=gen).bfloat16()
    probs = torch.softmax(torch.randn(N, E, generator=gen), dim=-1)
    scale, ids = torch.topk(probs, K)
    return w13, w2, hidden, ids.int(), (scale / scale.sum(-1, keepdim=True)).float()


def in_float64(w13, w2, hidden, ids, scale):
    """Each slot's SiLU MLP in float64, the intermediate rounded to bf16, weighted sum."""
    out = torch.zeros(N, H, dtype=torch.float64)
    for t in range(N):
        for j in range(K):
            e = int(ids[t, j])
            a = hidden[t].double() @ w13[e].double().t()
            h = (torch.nn.functional.silu(a[:INTER]) * a[INTER:]).bfloat16().double()
            out[t] += float(scale[t, j]) * (h @ w2[e].double().t())
    return out


def test_the_float32_path_is_the_float64_math_to_float32_accuracy():
    w13, w2, hidden, ids, scale = weights_and_routing()
    got = experts_in_float32((w13, w2), hidden, ExpertRouting(ids, scale))
    want = in_float64(w13, w2, hidden, ids, scale)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def test_zero_weight_slots_add_nothing_and_each_rank_adds_its_share():
    w13, w2, hidden, ids, scale = weights_and_routing(1)
    whole = experts_in_float32((w13, w2), hidden, ExpertRouting(ids, scale))
    mine = ids < E // 2
    parts = [
        experts_in_float32((w13, w2), hidden, ExpertRouting(ids, torch.where(m, scale, 0.0)))
        for m in (mine, ~mine)
    ]
    assert torch.allclose(parts[0] + parts[1], whole, rtol=1e-6, atol=1e-7)


def test_float32_partials_rounded_once_keep_the_single_rounding_that_bf16_partials_lose():
    """Two FFN ranks' shares of one weighted sum: float32 partials added and rounded to
    bf16 once differ from the whole sum rounded once (float64 math) in far fewer elements
    than bf16 partials (each rounded, then added and rounded again).

    The reference is our own float64 math, not vLLM's expert kernel: where that kernel
    rounds depends on the processor (its ``vec`` path agreed with float32 partials in
    every element on an AMD EPYC and in few on another CI host; docs/testing.md), so a
    comparison with it could not hold on every x86-64 machine."""
    w13, w2, hidden, ids, scale = weights_and_routing(2)
    mine = ids < E // 2
    shares = [torch.where(m, scale, 0.0) for m in (mine, ~mine)]
    whole = in_float64(w13, w2, hidden, ids, scale).bfloat16()
    bf16_parts = sum(in_float64(w13, w2, hidden, ids, s).bfloat16().double() for s in shares)
    fp32_parts = sum(
        experts_in_float32((w13, w2), hidden, ExpertRouting(ids, share)) for share in shares
    )
    differ_bf16 = int((bf16_parts.bfloat16() != whole).sum())
    differ_fp32 = int((fp32_parts.bfloat16() != whole).sum())
    assert differ_fp32 * 10 < differ_bf16, (differ_fp32, differ_bf16)
