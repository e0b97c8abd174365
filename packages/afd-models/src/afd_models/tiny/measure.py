"""Measure how sharp a tiny model's greedy decisions are, with Hugging Face on CPU.

All on :data:`~afd_models.tiny.specs.PROMPTS`; a *gap* is the logit of the greedy token
minus the best other logit (the top-1/top-2 logprob gap), teacher-forced on the fp32
greedy tokens:

* the smallest gap of the fp32 greedy run (nats);
* the largest change of a gap under bf16 compute: the rounding noise a gap has to beat;
* the mean change of a gap when every MLP/MoE output is zeroed: how visible the FFN role
  is in the logprobs, so that a broken exchange cannot go unnoticed;
* the share of greedy tokens that change when every MLP/MoE output is zeroed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_models.tiny.specs import MIN_FFN_EFFECT_RATIO, MIN_GAP_NATS, MIN_MARGIN_RATIO

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Margin:
    """The measured sharpness of one model (see the module docstring).

    ``continuations``: the fp32 greedy token ids of every prompt.
    """

    min_gap_nats: float
    max_bf16_shift_nats: float
    mean_ffn_shift_nats: float
    ffn_token_share: float
    distinct_tokens: int
    continuations: tuple[tuple[int, ...], ...]

    @property
    def margin_ratio(self) -> float:
        """``min_gap_nats`` over the bf16 shift (how many times the noise fits in the gap)."""
        return self.min_gap_nats / max(self.max_bf16_shift_nats, 1e-6)

    def shortfalls(self) -> list[str]:
        """Why this model is not sharp enough; empty when it is."""
        found = []
        if self.min_gap_nats < MIN_GAP_NATS:
            found.append(f"min top-1/top-2 gap {self.min_gap_nats:.3f} < {MIN_GAP_NATS} nats")
        if self.margin_ratio < MIN_MARGIN_RATIO:
            found.append(f"gap / bf16 shift {self.margin_ratio:.1f} < {MIN_MARGIN_RATIO}")
        if self.mean_ffn_shift_nats < MIN_FFN_EFFECT_RATIO * self.max_bf16_shift_nats:
            found.append(
                f"mean gap change without FFN {self.mean_ffn_shift_nats:.3f} < "
                f"{MIN_FFN_EFFECT_RATIO} x bf16 shift"
            )
        return found


def measure(model: torch.nn.Module, prompts: Sequence[Sequence[int]], num_tokens: int) -> Margin:
    """Measure ``model`` (fp32 parameters; returned in fp32) on tokenised ``prompts``."""
    import torch

    model.eval()
    with torch.inference_mode():
        continuations = [_greedy(model, p, num_tokens) for p in prompts]
        gaps32 = _all_gaps(model, prompts, continuations)
        model.to(torch.bfloat16)
        try:
            gaps16 = _all_gaps(model, prompts, continuations)
        finally:
            model.to(torch.float32)
        hooks = [
            layer.mlp.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))
            for layer in model.model.layers
        ]
        try:
            gaps_no_ffn = _all_gaps(model, prompts, continuations)
            ablated = [_greedy(model, p, num_tokens) for p in prompts]
        finally:
            for hook in hooks:
                hook.remove()
    pairs = zip(continuations, ablated, strict=True)
    changed = sum(a != b for c, d in pairs for a, b in zip(c, d, strict=True))
    return Margin(
        min_gap_nats=float(gaps32.min()),
        max_bf16_shift_nats=float((gaps32 - gaps16).abs().max()),
        mean_ffn_shift_nats=float((gaps32 - gaps_no_ffn).abs().mean()),
        ffn_token_share=changed / (len(prompts) * num_tokens),
        distinct_tokens=len({t for c in continuations for t in c}),
        continuations=tuple(tuple(c) for c in continuations),
    )


def _greedy(model: torch.nn.Module, prompt: Sequence[int], num_tokens: int) -> list[int]:
    import torch

    out = model(torch.tensor([list(prompt)]), use_cache=True)
    tokens = [int(out.logits[0, -1].argmax())]
    while len(tokens) < num_tokens:
        out = model(
            torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True
        )
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def _all_gaps(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], continuations: list[list[int]]
) -> torch.Tensor:
    import torch

    pairs = zip(prompts, continuations, strict=True)
    return torch.cat([_gaps(model, p, c) for p, c in pairs])


def _gaps(
    model: torch.nn.Module, prompt: Sequence[int], continuation: Sequence[int]
) -> torch.Tensor:
    """Logit of each continuation token minus the best other logit, teacher-forced."""
    import torch

    seq = [*prompt, *continuation]
    logits = model(torch.tensor([seq[:-1]])).logits[0, len(prompt) - 1 :].float()
    chosen = torch.tensor(continuation)[:, None]
    chosen_logit = logits.gather(1, chosen)[:, 0]
    others = logits.scatter(1, chosen, float("-inf"))
    return chosen_logit - others.max(dim=1).values
