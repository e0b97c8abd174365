"""Give a random model sharp, yet FFN-dependent, greedy decisions.

A random lm_head scores the final hidden state against 1024 unrelated directions, so the
best two scores are often a hair apart, and scaling the lm_head does not help: it scales
the rounding noise of bf16 compute by the same factor. Instead the lm_head is built from
the input embeddings: the row of token ``successor[x]`` is the unit embedding of ``x``
times ``lm_head_scale``. The final hidden state is dominated by the current token's
embedding, and random 128-dimensional embeddings are nearly orthogonal, so one token wins
by a wide margin (the embeddings are scaled by ``embedding_scale`` to keep it so). The
attention and FFN outputs still move the hidden state: with the expert/MLP ``down_proj``
scaled by ``ffn_output_scale`` they change the logprobs by about a nat or more, far above
bf16 rounding noise, while the greedy tokens follow the successor map of the last token
(``measure`` checks all of this).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from afd_models.tiny.specs import TinyModelSpec

if TYPE_CHECKING:
    import torch


def sharpen(model: torch.nn.Module, spec: TinyModelSpec, regular_ids: list[int], seed: int) -> None:
    """Rewrite ``model``'s lm_head and scale its FFN outputs, in place and seeded.

    ``regular_ids``: the token ids the model may predict (the tokenizer's ordinary
    tokens); every other lm_head row is zero, so special tokens (EOS included) and unused
    vocabulary slots are never the greedy choice.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor(regular_ids)
    successor = ids[torch.randperm(len(ids), generator=generator)]
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(spec.embedding_scale)
        embeddings = model.get_input_embeddings().weight[ids]
        rows = embeddings / embeddings.norm(dim=1, keepdim=True)
        lm_head = model.get_output_embeddings().weight
        lm_head.zero_()
        lm_head[successor] = spec.lm_head_scale * rows
        for name, param in model.named_parameters():
            if ".mlp." in name and "down_proj" in name:
                param.mul_(spec.ffn_output_scale)
