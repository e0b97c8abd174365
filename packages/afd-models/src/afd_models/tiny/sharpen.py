"""Give a random model sharp greedy decisions that depend on its FFN.

A random lm_head scores the final hidden state against 1024 unrelated directions, so the
best two scores are often a hair apart, and scaling the lm_head does not help: it scales
the rounding noise of bf16 compute by the same factor. Instead the lm_head is built from
the model itself: the row of token ``successor[x]`` is the final hidden state of token
``x`` run alone (position 0, :mod:`afd_models.tiny.alone`), normalised, times
``lm_head_scale``. Greedy decoding then follows the successor map of the last token, by a
wide margin, as long as a token's final hidden state in context stays close to its state
alone and the states of different tokens are far apart (random 128-dimensional directions
nearly are). Two scales see to that:

* ``embedding_scale`` and ``ffn_output_scale`` make what the current token contributes
  (its embedding and the FFN outputs computed from it) outweigh the attention output,
  the part that depends on the context;
* ``ffn_output_scale`` makes the FFN outputs the larger part of that, so with them zeroed
  the final hidden state points elsewhere and most greedy tokens change: equal tokens
  prove the FFN path, not only the attention path.

Routing is the one discontinuity: on a near-tie of the k-th and (k+1)-th router logit,
rounding picks which expert is k-th, and with independent experts that swaps a large
part of a large output. ``expert_spread`` below 1 gives the routed experts of a layer a
shared part, so such a swap moves the output little while each expert still contributes
its own. ``measure`` checks all of this; the build fails when it does not hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from afd_models.tiny.alone import final_hidden_alone
from afd_models.tiny.specs import TinyModelSpec

if TYPE_CHECKING:
    import torch


def sharpen(model: torch.nn.Module, spec: TinyModelSpec, regular_ids: list[int], seed: int) -> None:
    """Scale ``model``'s embeddings and FFN outputs and rebuild its lm_head, in place, seeded.

    ``model`` holds fp32 parameters. ``regular_ids``: the token ids the model may predict
    (the tokenizer's ordinary tokens); every other lm_head row is zero, so special tokens
    (EOS included) and unused vocabulary slots are never the greedy choice.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor(regular_ids)
    successor = ids[torch.randperm(len(ids), generator=generator)]
    init_std = float(model.config.initializer_range)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(spec.embedding_scale)
        for name, param in model.named_parameters():
            if ".mlp.experts." in name and spec.expert_spread < 1:
                # One [experts, ...] tensor per layer: every expert gets the same shared part.
                shared = torch.randn(param.shape[1:], generator=generator) * init_std
                own = spec.expert_spread
                param.mul_(own).add_(shared, alpha=(1 - own**2) ** 0.5)
            if ".mlp." in name and "down_proj" in name:
                param.mul_(spec.ffn_output_scale)
        model.eval()
        alone = final_hidden_alone(model, ids)
        rows = spec.lm_head_scale * alone / alone.norm(dim=1, keepdim=True)
        lm_head = model.get_output_embeddings().weight
        lm_head.zero_()
        lm_head[successor] = rows.to(lm_head.dtype)
