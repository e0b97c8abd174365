"""Behaviour every role class shares, whatever the architecture.

A role class lists the mixin first in its bases, before the registered wrapper
(``class AttentionX(AttentionRoleMixin, AFDX)``), so the mixin's methods win over the
stock ones and ``super()`` reaches the stock model. Each role class's ``__init__`` sets
``afd`` (the :class:`~afd_core.config.AFDConfig`) and ``afd_wire`` (its WireSpec).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import torch
from torch import nn
from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import (
    MoERunnerInterface,
)
from vllm.model_executor.models.utils import AutoWeightsLoader

from afd_core.config import AFDConfig
from afd_core.connector import WireSpec
from afd_models.layers import FFNStack
from afd_models.roles import FFN_NOT_SCHEDULED
from afd_models.weight_filter import role_weights


class AttentionRoleMixin:
    """The attention role: the stock model, loading only the attention role's tensors."""

    afd: AFDConfig
    afd_wire: WireSpec

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """Every decoder layer, in order: each one exchanges once per forward."""
        return tuple(range(self.afd_wire.num_exchange_layers))

    def afd_wire_spec(self) -> WireSpec:
        """The shapes this role sends and expects."""
        return self.afd_wire

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The stock loader, fed only the tensors the attention role owns."""
        gate_on_attention = self.afd.compute_gate_on_attention
        kept = role_weights(weights, "attention", gate_on_attention=gate_on_attention)
        return super().load_weights(kept)  # type: ignore[misc]


class FFNRoleMixin:
    """The FFN role: ``model.layers[N].mlp`` blocks driven by the FFN loop."""

    afd: AFDConfig
    afd_wire: WireSpec
    model: FFNStack

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """Every decoder layer, in order: each one exchanges once per forward."""
        return tuple(range(len(self.model.layers)))

    def afd_wire_spec(self) -> WireSpec:
        """The shapes this role receives and returns."""
        return self.afd_wire

    def afd_compute_ffn(
        self, layer: int, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> torch.Tensor:
        """Run layer ``layer``'s block on ``hidden``; see :class:`afd_models.roles.FFNModel`.

        Raises IndexError for a layer this model does not have and ValueError when
        ``router_logits`` is given where the gate runs on FFN (or missing where it runs
        on attention).
        """
        if not 0 <= layer < len(self.model.layers):
            raise IndexError(
                f"AFD FFN: layer {layer} is not a decoder layer of this model "
                f"(0..{len(self.model.layers) - 1})"
            )
        mlp = self.model.layers[layer].mlp
        routed = isinstance(getattr(mlp, "experts", None), MoERunnerInterface)
        if routed and self.afd.compute_gate_on_attention:
            if router_logits is None:
                raise ValueError(
                    f"AFD FFN: layer {layer} needs router logits: the gate runs on the "
                    "attention role (compute_gate_on_attention=true)"
                )
            # What the stock block's forward does, with the attention role's logits in
            # place of the gate it no longer holds (the runner's gate is None).
            return mlp.experts(hidden_states=hidden, router_logits=router_logits)
        if router_logits is not None:
            raise ValueError(
                f"AFD FFN: layer {layer} got router logits, but "
                + (
                    "the gate runs on the FFN role (compute_gate_on_attention=false)"
                    if routed
                    else "it is a dense layer"
                )
            )
        return self.afd_finish_block(mlp, mlp(hidden))

    def afd_finish_block(self, mlp: nn.Module, output: torch.Tensor) -> torch.Tensor:
        """Hook: what the stock decoder layer does to ``mlp``'s output right after the
        block (before the residual add); the default does nothing."""
        return output

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load only the FFN role's tensors, through the stack's stock loader."""
        gate_on_attention = self.afd.compute_gate_on_attention
        kept = role_weights(weights, "ffn", gate_on_attention=gate_on_attention)
        return AutoWeightsLoader(self).load_weights(kept)

    def forward(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("AFD: " + FFN_NOT_SCHEDULED.format(what="forward"))

    def compute_logits(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("AFD: " + FFN_NOT_SCHEDULED.format(what="compute_logits"))

    def embed_input_ids(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("AFD: " + FFN_NOT_SCHEDULED.format(what="embed_input_ids"))
