"""A decode step of one deployment: per-layer time with m stages, TPOT, tokens per second.

**AFD** (A attention ranks, F FFN ranks, ``batch`` sequences per attention rank split
into ``stages`` stages of ``ceil(batch / stages)``). Per decoder layer, with ``t_attn``,
``t_ffn`` and ``t_comm`` (the exchange's round trip) of one stage and ``t_link`` the
time one stage's bytes hold the busiest link in one direction::

    t_layer = max(t_attn + t_ffn + t_comm, stages * max(t_attn, t_ffn, t_link))

The first term is one stage's chain through the layer; the second says each role (and
the link) serves every stage in turn. Without the link term this is the published
per-MoE-layer constraint (light-llm-simulator, MegaScale-Infer's ping-pong).

* P2P layout: FFN rank f serves a block of ``ceil(A / F)`` attention ranks with all
  experts; every layer (dense ones too) exchanges.
* expert-routed layout: a token goes to each FFN rank holding one of its k experts
  (``F x (1 - (1 - 1/F)^k)`` ranks expected), each rank computes its ``ceil(E / F)``
  experts for the tokens of all A ranks; shared experts, gate and dense layers run on
  the attention rank; only sparse layers exchange.

**Monolithic vLLM with expert parallelism** on D devices (``batch`` per device, data-
parallel attention): each device computes attention and ``ceil(E / D)`` experts; the
all-to-all dispatch and combine form ``t_comm``, so::

    t_layer = max(t_attn + t_ffn + t_comm, stages * max(t_attn + t_ffn, t_link))

TPOT is the sum over layers plus the step outside the layers (LM head, sampling,
scheduling) and, with a measured ``serving_overhead``, the served step's process overhead;
tokens per second per device are ``sequences / TPOT / devices``. Both are charged once
per step on the attention role (the device, monolithic), whatever the stage count: vLLM
schedules, samples and hands outputs over once per step. What a second stage costs per
layer on the host (AFD's Python and hand-over per stage) is not measured and not charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from afd_core.kit.pairing import ALL_TO_ALL, BLOCK, Pairing
from afd_core.plan import memory
from afd_core.plan.costs import ZERO, Cost, LayerCosts
from afd_core.plan.memory import Memory
from afd_core.plan.model_shape import ACTIVATION_BYTES, ModelShape

#: The two AFD layouts: afd-core's P2P connectors and the expert-routed connector.
LAYOUTS = ("p2p", "expert")
#: How each layout pairs the ranks (:mod:`afd_core.kit.pairing`).
PAIRINGS: dict[str, Pairing] = {"p2p": BLOCK, "expert": ALL_TO_ALL}
#: Routing metadata per (token, FFN rank) in the expert-routed layout: k ids and weights.
ROUTING_BYTES_PER_EXPERT = 8


@dataclass(frozen=True)
class AFDDeployment:
    """An AFD deployment: ``batch`` sequences per attention rank in ``stages`` stages."""

    layout: str
    attention_ranks: int
    ffn_ranks: int
    batch: int
    stages: int

    @property
    def devices(self) -> int:
        """Attention ranks and FFN ranks, one device each."""
        return self.attention_ranks + self.ffn_ranks


@dataclass(frozen=True)
class MonolithicDeployment:
    """Monolithic vLLM with expert parallelism: ``batch`` sequences per device."""

    devices: int
    batch: int
    stages: int


@dataclass(frozen=True)
class LayerTime:
    """One decoder layer: each part for one stage, and the layer time it gives."""

    attention: Cost
    ffn: Cost
    exchange: Cost
    link_s: float
    stages: int
    colocated: bool

    @property
    def seconds(self) -> float:
        """``max(chain, stages x busiest resource)`` (see the module docstring)."""
        return max(self._chain(), self.stages * max(self._resources().values()))

    @property
    def bound(self) -> str:
        """What sets the layer time, e.g. ``"FFN (memory bandwidth)"`` or ``"link"``."""
        chain = self._chain()
        parts = (
            {"attention": self.attention, "FFN": self.ffn, "exchange": self.exchange}
            if chain >= self.stages * max(self._resources().values())
            else self._occupants()
        )
        name, cost = max(parts.items(), key=lambda item: item[1].seconds)
        if cost.limiter in ("compute", "memory bandwidth"):
            return f"{name} ({cost.limiter})"
        return name

    def _chain(self) -> float:
        return self.attention.seconds + self.ffn.seconds + self.exchange.seconds

    def _occupants(self) -> dict[str, Cost]:
        link = Cost(self.link_s, "link")
        if self.colocated:
            return {"attention + FFN": self.attention + self.ffn, "link": link}
        return {"attention": self.attention, "FFN": self.ffn, "link": link}

    def _resources(self) -> dict[str, float]:
        return {name: cost.seconds for name, cost in self._occupants().items()}


@dataclass(frozen=True)
class Prediction:
    """A deployment's decode step, and each role's memory per device."""

    tpot_s: float
    sequences: int
    devices: int
    sparse_layer: LayerTime
    dense_layer: LayerTime | None
    outside_layers_s: float  # once per step: outside the layers, and serving when measured
    memory: dict[str, Memory]

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of the whole deployment."""
        return self.sequences / self.tpot_s

    @property
    def tokens_per_s_per_device(self) -> float:
        """Output tokens per second per device."""
        return self.tokens_per_s / self.devices


def predict_afd(
    shape: ModelShape, costs: LayerCosts, plan: AFDDeployment, context: int
) -> Prediction:
    """The decode step of an AFD deployment with ``context`` cached tokens per sequence."""
    a, f, m = plan.attention_ranks, plan.ffn_ranks, plan.stages
    stage = math.ceil(plan.batch / m)
    width = shape.hidden_size * ACTIVATION_BYTES
    attn = costs.attention(stage, context)
    if plan.layout == "p2p":
        held, served = shape.num_experts, math.ceil(a / f) * stage
        wire = served * width  # the FFN endpoint of the largest block
        sparse = _afd_layer(
            attn, costs.experts(served, held) + costs.shared(served), costs, wire, m
        )
        dense = _afd_layer(attn, costs.dense(served), costs, wire, m)
    else:
        held = math.ceil(shape.num_experts / f)
        ranks = f * (1 - (1 - 1 / f) ** shape.experts_per_token)
        per_token = width + ROUTING_BYTES_PER_EXPERT * shape.experts_per_token
        wire = max(stage * ranks, a * stage * ranks / f) * per_token
        sparse = _afd_layer(
            attn + costs.shared(stage), costs.experts(a * stage, held), costs, wire, m
        )
        dense = _afd_layer(attn + costs.dense(stage), ZERO, costs, 0.0, m)
        served = a * stage
    outside = _outside(costs, plan.batch)
    return Prediction(
        tpot_s=_tpot(shape, sparse, dense, outside),
        sequences=a * plan.batch,
        devices=plan.devices,
        sparse_layer=sparse,
        dense_layer=dense if shape.dense_layers else None,
        outside_layers_s=outside,
        memory={
            "attention rank": memory.attention_rank(shape, plan.layout, plan.batch, context),
            "FFN rank": memory.ffn_rank(shape, plan.layout, held, served * m),
        },
    )


def predict_monolithic(
    shape: ModelShape, costs: LayerCosts, plan: MonolithicDeployment, context: int
) -> Prediction:
    """The decode step of monolithic vLLM with expert parallelism over ``plan.devices``."""
    d, m = plan.devices, plan.stages
    stage = math.ceil(plan.batch / m)
    held = math.ceil(shape.num_experts / d)
    remote = (d - 1) * (1 - (1 - 1 / d) ** shape.experts_per_token)
    wire = stage * remote * shape.hidden_size * ACTIVATION_BYTES
    attn = costs.attention(stage, context)
    sparse = LayerTime(
        attn,
        costs.experts(d * stage, held) + costs.shared(stage),
        costs.transfer(wire),
        costs.link_busy(wire),
        m,
        colocated=True,
    )
    dense = LayerTime(attn, costs.dense(stage), ZERO, 0.0, m, colocated=True)
    outside = _outside(costs, plan.batch)
    return Prediction(
        tpot_s=_tpot(shape, sparse, dense, outside),
        sequences=d * plan.batch,
        devices=d,
        sparse_layer=sparse,
        dense_layer=dense if shape.dense_layers else None,
        outside_layers_s=outside,
        memory={"device": memory.monolithic_rank(shape, d, plan.batch, context)},
    )


def _afd_layer(attn: Cost, ffn: Cost, costs: LayerCosts, wire: float, stages: int) -> LayerTime:
    return LayerTime(
        attn, ffn, costs.transfer(wire), costs.link_busy(wire), stages, colocated=False
    )


def _outside(costs: LayerCosts, batch: int) -> float:
    """Once per step on the attention role: the step outside the layers and serving."""
    return (costs.outside_layers(batch) + costs.serving(batch)).seconds


def _tpot(shape: ModelShape, sparse: LayerTime, dense: LayerTime, outside: float) -> float:
    layers = shape.moe_layers * sparse.seconds + shape.dense_layers * dense.seconds
    return layers + outside
