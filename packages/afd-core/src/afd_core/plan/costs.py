"""Per-layer costs on one device: attention, experts, MLPs, the LM head and the wire.

Each cost is the roofline ``max(FLOPs / (peak x flops_efficiency), bytes / (HBM x
bandwidth_efficiency))`` plus the device's ``layer_overhead_s`` for each layer a role
runs, unless the profile holds measured tables of this very model, which then replace
the roofline for what they cover (attention, the MoE block, dense MLPs, the step outside
the layers, the served step's process overhead). Decode only: a batch of ``batch``
sequences, one new token each, with ``context`` tokens cached per sequence.

* attention: ``2 x params`` FLOPs per token plus the scores and weighted sum over the
  context; bytes are the weights once plus every sequence's KV cache (GQA: keys and
  values of every KV head; MLA: the compressed latent, decoded in absorbed form).
* routed experts of a rank holding ``experts_held`` of E, serving ``tokens`` tokens with
  top-k routing spread evenly: ``tokens x k x experts_held / E`` (token, expert) pairs of
  ``6 x hidden x intermediate`` FLOPs; bytes are the weights of the experts at least one
  token hits (``experts_held x (1 - (1 - k/E)^tokens)`` expected) and the activations.
* shared experts and the router gate (every token, where the token is) and dense MLPs.
* the wire: ``latency + bytes / bandwidth`` each way on the busiest endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from afd_core.errors import AFDConfigError
from afd_core.plan.model_shape import ACTIVATION_BYTES, ModelShape
from afd_core.plan.profile import HardwareProfile


@dataclass(frozen=True)
class Cost:
    """Seconds, and what sets them: ``compute`` or ``memory bandwidth`` (roofline),
    ``measured`` (a table), ``exchange``, ``step overhead``, ``link``, or ``none``."""

    seconds: float
    limiter: str

    def __add__(self, other: Cost) -> Cost:
        limiter = self.limiter if self.seconds >= other.seconds else other.limiter
        return Cost(self.seconds + other.seconds, limiter)


ZERO = Cost(0.0, "none")


class LayerCosts:
    """The cost functions of one model on one device (see the module docstring).

    Raises AFDConfigError when the profile's measured tables are of another model.
    """

    def __init__(self, shape: ModelShape, profile: HardwareProfile) -> None:
        self.shape = shape
        self.device = profile.device
        self.link = profile.link
        measured = profile.measured
        if measured is not None and dict(measured.model) != shape.fingerprint():
            raise _mismatch(profile, shape)
        self.measured = measured

    def attention(self, batch: float, context: float) -> Cost:
        """One layer's attention for ``batch`` decoding sequences of ``context`` tokens."""
        if batch <= 0:
            return ZERO
        if self.measured is not None:
            return Cost(self.measured.attention(batch, context), "measured")
        s, a = self.shape, self.shape.attention
        flops = batch * (2 * s.attention_params + a.decode_flops_per_context_token * context)
        kv = batch * context * a.kv_elements_per_token * ACTIVATION_BYTES
        weights = s.attention_params * s.weight_bytes
        return self._roofline(flops, weights + kv + self._activations(batch, 4), overhead=True)

    def experts(self, tokens: float, experts_held: int) -> Cost:
        """Routed experts of a rank holding ``experts_held`` experts, serving ``tokens``.

        With measured tables this is the whole measured MoE block at the same number of
        (token, expert) pairs, shared experts and gate included (see :meth:`shared`).
        """
        s = self.shape
        pairs = tokens * s.experts_per_token * experts_held / s.num_experts
        if pairs <= 0:
            return ZERO
        if self.measured is not None:
            return Cost(self.measured.moe(pairs / s.experts_per_token), "measured")
        hit = 1 - (1 - s.experts_per_token / s.num_experts) ** tokens
        weights = experts_held * hit * s.expert_params * s.weight_bytes
        activations = pairs * (2 * s.hidden_size + 3 * s.expert_intermediate) * ACTIVATION_BYTES
        flops = 2 * pairs * s.expert_params
        return self._roofline(flops, weights + activations, overhead=True, fp8=s.weight_bytes == 1)

    def shared(self, tokens: float) -> Cost:
        """A sparse layer's shared experts and router gate for ``tokens`` tokens.

        Zero with measured tables: the measured MoE block holds them already.
        """
        if tokens <= 0 or self.measured is not None:
            return ZERO
        s = self.shape
        flops = 2 * tokens * s.shared_params
        bytes_ = s.shared_params * s.weight_bytes + self._activations(tokens, 2)
        return self._roofline(flops, bytes_, overhead=False)

    def dense(self, tokens: float) -> Cost:
        """One dense MLP for ``tokens`` tokens."""
        if tokens <= 0:
            return ZERO
        if self.measured is not None and self.measured.dense is not None:
            return Cost(self.measured.dense(tokens), "measured")
        s = self.shape
        flops = 2 * tokens * s.dense_params
        bytes_ = s.dense_params * s.weight_bytes + self._activations(tokens, 2)
        return self._roofline(flops, bytes_, overhead=True)

    def outside_layers(self, batch: float) -> Cost:
        """A decode step's time outside the decoder layers: LM head, sampling, scheduling."""
        if self.measured is not None:
            return Cost(self.measured.step_overhead(batch), "measured")
        s = self.shape
        head = s.vocab_size * s.hidden_size
        cost = self._roofline(2 * batch * head, head * s.weight_bytes, overhead=False)
        return cost + Cost(self.device.step_overhead_s, "step overhead")

    def serving(self, batch: float) -> Cost:
        """What a served decode step costs beyond :meth:`outside_layers` and the layers:
        the measured ``serving_overhead`` (vLLM's engine core and worker in their own
        processes on the role's cores); zero without that table (rooflines, version 1)."""
        if self.measured is None or self.measured.serving_overhead is None:
            return ZERO
        return Cost(self.measured.serving_overhead(batch), "measured")

    def transfer(self, bytes_one_way: float) -> Cost:
        """A round trip carrying ``bytes_one_way`` each way over the busiest endpoint."""
        if bytes_one_way <= 0:
            return ZERO
        one_way = self.link.latency_s + bytes_one_way / self.link.bytes_per_s
        return Cost(2 * one_way, "exchange")

    def link_busy(self, bytes_one_way: float) -> float:
        """Seconds one direction of the busiest link is occupied by ``bytes_one_way``."""
        return bytes_one_way / self.link.bytes_per_s

    def prefill(self, tokens: int) -> float:
        """Seconds of one prompt's pass through every layer on one device (roofline).

        A lower bound for TTFT: no queueing, no other requests, all experts local.
        """
        s, a = self.shape, self.shape.attention
        pairs = tokens * (tokens + 1) / 2
        attention = self._roofline(
            2 * tokens * s.attention_params + a.prefill_flops_per_token_pair * pairs,
            s.attention_params * s.weight_bytes + self._activations(tokens, 4),
            overhead=True,
        ).seconds
        routed = tokens * s.experts_per_token * s.expert_params
        moe_flops = 2 * (routed + tokens * s.shared_params)
        moe_bytes = (s.num_experts * s.expert_params + s.shared_params) * s.weight_bytes
        moe = self._roofline(moe_flops, moe_bytes, overhead=True).seconds
        dense = self._roofline(
            2 * tokens * s.dense_params, s.dense_params * s.weight_bytes, overhead=True
        ).seconds
        return s.num_layers * attention + s.moe_layers * moe + s.dense_layers * dense

    def _activations(self, tokens: float, copies: int) -> float:
        return tokens * copies * self.shape.hidden_size * ACTIVATION_BYTES

    def _roofline(self, flops: float, bytes_: float, overhead: bool, fp8: bool = False) -> Cost:
        d = self.device
        peak = d.peak_fp8_flops_per_s if fp8 and d.peak_fp8_flops_per_s else d.peak_bf16_flops_per_s
        compute = flops / (peak * d.flops_efficiency)
        memory = bytes_ / (d.hbm_bytes_per_s * d.bandwidth_efficiency)
        limiter = "compute" if compute >= memory else "memory bandwidth"
        return Cost(max(compute, memory) + (d.layer_overhead_s if overhead else 0.0), limiter)


def _mismatch(profile: HardwareProfile, shape: ModelShape) -> AFDConfigError:
    assert profile.measured is not None
    measured, wanted = profile.measured.model, shape.fingerprint()
    key = next(k for k in sorted(set(measured) | set(wanted)) if measured.get(k) != wanted.get(k))
    return AFDConfigError(
        f"profile {profile.name!r} was measured on another model ({key} "
        f"{measured.get(key)!r}, this model {wanted.get(key)!r}); run afd measure on this "
        "model, or plan with a roofline profile"
    )
