"""What each role keeps in one device's memory: weights, KV cache and activations.

Which weights live where follows afd-models (docs/models.md):

* P2P layout: the attention role holds attention, norms, embeddings and the LM head; the
  FFN rank holds every sparse layer's routed experts, shared experts and gate, and every
  dense MLP.
* expert-routed layout: the attention role also holds the gate, the shared experts and
  the dense MLPs; FFN rank *f* holds only its block of ``ceil(E / F)`` routed experts.
* monolithic vLLM with expert parallelism over D devices: every device holds everything
  but the routed experts, and ``ceil(E / D)`` of those.

The KV cache is ``batch x context x kv_bytes_per_token`` (MLA: the compressed latent).
Activations are counted for the decode batch only (hidden states, the MoE intermediate
and fp32 logits); vLLM's reserve for a prefill chunk is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from afd_core.plan.model_shape import ACTIVATION_BYTES, ModelShape


@dataclass(frozen=True)
class Memory:
    """Bytes one device of a role needs."""

    weights: float
    kv_cache: float
    activations: float

    @property
    def total(self) -> float:
        """Everything together."""
        return self.weights + self.kv_cache + self.activations


def attention_rank(shape: ModelShape, layout: str, batch: int, context: int) -> Memory:
    """An attention rank of an AFD deployment (``layout`` ``"p2p"`` or ``"expert"``)."""
    weights = _attention_weights(shape)
    if layout == "expert":
        weights += _local_mlp_weights(shape)
    return Memory(weights, _kv(shape, batch, context), _decode_activations(shape, batch))


def ffn_rank(shape: ModelShape, layout: str, experts_held: int, tokens: float) -> Memory:
    """An FFN rank holding ``experts_held`` routed experts, serving ``tokens`` per step."""
    weights = shape.moe_layers * experts_held * shape.expert_params * shape.weight_bytes
    if layout == "p2p":
        weights += _local_mlp_weights(shape)
    pairs = tokens * shape.experts_per_token * experts_held / shape.num_experts
    working = 2 * tokens * shape.hidden_size + 2 * pairs * shape.expert_intermediate
    return Memory(weights, 0.0, working * ACTIVATION_BYTES)


def monolithic_rank(shape: ModelShape, devices: int, batch: int, context: int) -> Memory:
    """One device of monolithic vLLM with expert parallelism over ``devices``."""
    held = math.ceil(shape.num_experts / devices)
    weights = _attention_weights(shape) + _local_mlp_weights(shape)
    weights += shape.moe_layers * held * shape.expert_params * shape.weight_bytes
    return Memory(weights, _kv(shape, batch, context), _decode_activations(shape, batch))


def _attention_weights(shape: ModelShape) -> float:
    # Embeddings stay 16-bit in fp8 checkpoints.
    layers = shape.num_layers * shape.attention_params * shape.weight_bytes
    return layers + shape.embedding_params * ACTIVATION_BYTES


def _local_mlp_weights(shape: ModelShape) -> float:
    """Shared experts, gates and dense MLPs: what stays with the token in expert routing."""
    elements = shape.moe_layers * shape.shared_params + shape.dense_layers * shape.dense_params
    return elements * shape.weight_bytes


def _kv(shape: ModelShape, batch: int, context: int) -> float:
    return batch * context * shape.kv_bytes_per_token


def _decode_activations(shape: ModelShape, batch: int) -> float:
    hidden = 8 * shape.hidden_size * ACTIVATION_BYTES
    intermediate = 2 * shape.experts_per_token * shape.expert_intermediate * ACTIVATION_BYTES
    return batch * (hidden + intermediate + 4 * shape.vocab_size)
