"""Measure how sharp a tiny model's greedy decisions are, with Hugging Face on CPU.

All on :data:`~afd_models.tiny.specs.PROMPTS`; a *gap* is the logit of the greedy token
minus the best other logit (the top-1/top-2 logprob gap), teacher-forced on the fp32
greedy tokens:

* the smallest gap of the fp32 greedy run (nats);
* the largest change of a gap under bf16 compute: the rounding noise a gap has to beat;
* the mean change of a gap when every MLP/MoE output (dense layers and shared experts
  included) is zeroed: how visible the FFN role is in the logprobs;
* how many greedy tokens change when every MLP/MoE output is zeroed, each on the same
  (fp32 greedy) prefix: a token counts only if the FFN decides it at its own step, not
  because an earlier token changed. Most must change, so that equal tokens prove the
  FFN path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_models.tiny.specs import (
    MIN_FFN_EFFECT_RATIO,
    MIN_FFN_TOKEN_SHARE,
    MIN_GAP_NATS,
    MIN_MARGIN_RATIO,
)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Margin:
    """The measured sharpness of one model (see the module docstring).

    ``continuations``: the fp32 greedy token ids of every prompt.
    ``ffn_changed_tokens``: how many of them differ from the greedy choice of the model
    with its FFN outputs zeroed, on the same prefix.
    """

    min_gap_nats: float
    max_bf16_shift_nats: float
    mean_ffn_shift_nats: float
    ffn_changed_tokens: int
    distinct_tokens: int
    continuations: tuple[tuple[int, ...], ...]

    @property
    def measured_tokens(self) -> int:
        """How many greedy tokens were measured (all prompts together)."""
        return sum(len(c) for c in self.continuations)

    @property
    def ffn_token_share(self) -> float:
        """The share of the measured greedy tokens that the FFN output decides."""
        return self.ffn_changed_tokens / self.measured_tokens

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
        if self.ffn_token_share < MIN_FFN_TOKEN_SHARE:
            found.append(
                f"zeroing the FFN changes {self.ffn_changed_tokens} of "
                f"{self.measured_tokens} greedy tokens ({self.ffn_token_share:.0%}) < "
                f"{MIN_FFN_TOKEN_SHARE:.0%}"
            )
        return found


def measure(model: torch.nn.Module, prompts: Sequence[Sequence[int]], num_tokens: int) -> Margin:
    """Measure ``model`` (fp32 parameters; returned in fp32) on tokenised ``prompts``."""
    import torch

    model.eval()
    with torch.inference_mode():
        continuations = [_greedy(model, p, num_tokens) for p in prompts]
        greedy = torch.tensor([t for c in continuations for t in c])
        gaps32 = _gaps(_all_logits(model, prompts, continuations), greedy)
        model.to(torch.bfloat16)
        try:
            gaps16 = _gaps(_all_logits(model, prompts, continuations), greedy)
        finally:
            model.to(torch.float32)
        hooks = [
            layer.mlp.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))
            for layer in model.model.layers
        ]
        try:
            logits_no_ffn = _all_logits(model, prompts, continuations)
        finally:
            for hook in hooks:
                hook.remove()
    return Margin(
        min_gap_nats=float(gaps32.min()),
        max_bf16_shift_nats=float((gaps32 - gaps16).abs().max()),
        mean_ffn_shift_nats=float((gaps32 - _gaps(logits_no_ffn, greedy)).abs().mean()),
        ffn_changed_tokens=int((logits_no_ffn.argmax(dim=1) != greedy).sum()),
        distinct_tokens=len(set(greedy.tolist())),
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


def _all_logits(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], continuations: list[list[int]]
) -> torch.Tensor:
    """fp32 logits [tokens, vocab] at every continuation position, teacher-forced."""
    import torch

    rows = []
    for prompt, continuation in zip(prompts, continuations, strict=True):
        seq = [*prompt, *continuation]
        rows.append(model(torch.tensor([seq[:-1]])).logits[0, len(prompt) - 1 :].float())
    return torch.cat(rows)


def _gaps(logits: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Logit of each ``chosen`` token minus the best other logit of its row."""
    chosen_logit = logits.gather(1, chosen[:, None])[:, 0]
    others = logits.scatter(1, chosen[:, None], float("-inf"))
    return chosen_logit - others.max(dim=1).values
