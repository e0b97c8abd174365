"""Measure how sharp a tiny model's greedy decisions are, with Hugging Face on CPU.

Three numbers per model, all on :data:`~afd_models.tiny.specs.PROMPTS`:

* the smallest top-1 minus top-2 logit gap of the fp32 greedy run (nats);
* the largest amount by which bf16 compute shrinks or grows such a gap, on the same
  tokens (teacher-forced): the rounding noise a gap has to beat;
* the share of greedy tokens that change when every MLP/MoE output is zeroed: proof that
  the tokens depend on the FFN role, so a broken exchange cannot go unnoticed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_models.tiny.specs import MIN_GAP_NATS, MIN_MARGIN_RATIO

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Margin:
    """The measured sharpness of one model (see the module docstring).

    ``continuations``: the fp32 greedy token ids of every prompt.
    """

    min_gap_nats: float
    max_bf16_shift_nats: float
    ffn_sensitivity: float
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
        if self.ffn_sensitivity == 0.0:
            found.append("zeroing the FFN outputs changes no greedy token")
        return found


def measure(model: torch.nn.Module, prompts: Sequence[Sequence[int]], num_tokens: int) -> Margin:
    """Measure ``model`` (fp32 parameters; returned in fp32) on tokenised ``prompts``."""
    import torch

    model.eval()
    with torch.inference_mode():
        continuations = [_greedy(model, p, num_tokens) for p in prompts]
        gaps32 = torch.cat([_gaps(model, p, c) for p, c in zip(prompts, continuations)])
        model.to(torch.bfloat16)
        try:
            gaps16 = torch.cat([_gaps(model, p, c) for p, c in zip(prompts, continuations)])
        finally:
            model.to(torch.float32)
        hooks = [
            layer.mlp.register_forward_hook(lambda _m, _i, out: torch.zeros_like(out))
            for layer in model.model.layers
        ]
        try:
            ablated = [_greedy(model, p, num_tokens) for p in prompts]
        finally:
            for hook in hooks:
                hook.remove()
    changed = sum(a != b for c, d in zip(continuations, ablated) for a, b in zip(c, d))
    return Margin(
        min_gap_nats=float(gaps32.min()),
        max_bf16_shift_nats=float((gaps32 - gaps16).abs().max()),
        ffn_sensitivity=changed / (len(prompts) * num_tokens),
        distinct_tokens=len({t for c in continuations for t in c}),
        continuations=tuple(tuple(c) for c in continuations),
    )


def _greedy(model: torch.nn.Module, prompt: Sequence[int], num_tokens: int) -> list[int]:
    import torch

    seq = list(prompt)
    for _ in range(num_tokens):
        logits = model(torch.tensor([seq])).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(prompt) :]


def _gaps(model: torch.nn.Module, prompt: Sequence[int], continuation: Sequence[int]):
    """Logit of each continuation token minus the best other logit, teacher-forced."""
    import torch

    seq = [*prompt, *continuation]
    logits = model(torch.tensor([seq[:-1]])).logits[0, len(prompt) - 1 :].float()
    chosen = torch.tensor(continuation)[:, None]
    chosen_logit = logits.gather(1, chosen)[:, 0]
    others = logits.scatter(1, chosen, float("-inf"))
    return chosen_logit - others.max(dim=1).values
