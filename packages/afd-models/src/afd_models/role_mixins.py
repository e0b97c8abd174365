"""Behaviour every role class shares, whatever the architecture.

A role class lists the mixin first in its bases, before the registered wrapper
(``class AttentionX(AttentionRoleMixin, AFDX)``), so the mixin's methods win over the
stock ones and ``super()`` reaches the stock model. Each role class's ``__init__`` sets
``afd`` (the :class:`~afd_core.config.AFDConfig`), ``afd_wire`` (its WireSpec) and, with
an expert-routed connector, ``afd_placement`` (and, on the FFN role, ``afd_ffn_rank``);
an FFN role of a stock MoE model does it with :meth:`FFNRoleMixin.afd_init_ffn_role`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import torch
from torch import nn
from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import (
    MoERunnerInterface,
)
from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix

from afd_core.config import AFDConfig
from afd_core.config.partials import partials_dtype
from afd_core.connector import ExpertRouting, WireSpec
from afd_core.placement import ExpertPlacement
from afd_models.layers import FFNStack, check_attention_role
from afd_models.roles import FFN_NOT_SCHEDULED, afd_config, clear_moe_attributes, ffn_role_rank
from afd_models.routed import LocalExperts, compute_local_experts, keep_reference_weights
from afd_models.weight_filter import role_weights

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from afd_models.stock_moe import StockMoEModel


class AttentionRoleMixin:
    """The attention role: the stock model, loading only the attention role's tensors."""

    afd: AFDConfig
    afd_wire: WireSpec
    afd_placement: ExpertPlacement | None = None

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """The exchanging decoder layers, in order (all of them, or the MoE layers of an
        expert-routed deployment): each one exchanges once per forward."""
        return self.afd_wire.exchange_layers

    def afd_wire_spec(self) -> WireSpec:
        """The shapes this role sends and expects."""
        return self.afd_wire

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The stock loader, fed only the tensors the attention role owns."""
        kept = role_weights(
            weights,
            "attention",
            gate_on_attention=self.afd.compute_gate_on_attention,
            placement=self.afd_placement,
        )
        return super().load_weights(kept)  # type: ignore[misc]


class StockAttentionRole(AttentionRoleMixin):
    """The attention role of a model whose stock ``__init__`` runs unchanged under the
    stand-ins of ``afd_stock`` (:meth:`StockMoEModel.attention_stand_ins`) and then calls
    ``set_moe_parameters``, which gives the role no local experts.

    A role class sets ``afd_stock`` and lists this class before the registered wrapper.
    """

    afd_stock: ClassVar[StockMoEModel]

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        afd = afd_config(vllm_config)
        assert afd is not None
        placement = self.afd_stock.placement(vllm_config, afd)
        wire = self.afd_stock.wire_spec(vllm_config, afd)
        with self.afd_stock.attention_stand_ins(placement):
            super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]
        routed_layers = None if placement is None else wire.exchange_layers
        check_attention_role(self.model.layers, type(self).__name__, routed_layers)  # type: ignore[attr-defined]
        self.afd = afd
        self.afd_wire = wire
        self.afd_placement = placement

    def set_moe_parameters(self) -> None:
        """Called by the stock ``__init__``: no local experts on the attention role."""
        clear_moe_attributes(self)


class NotScheduled:
    """What the scheduler would call on a model; an FFN role model is never scheduled."""

    def forward(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("AFD: " + FFN_NOT_SCHEDULED.format(what="forward"))

    def compute_logits(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("AFD: " + FFN_NOT_SCHEDULED.format(what="compute_logits"))

    def embed_input_ids(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError("AFD: " + FFN_NOT_SCHEDULED.format(what="embed_input_ids"))


class FFNRoleMixin(NotScheduled):
    """The FFN role: ``model.layers[N].mlp`` blocks driven by the FFN loop."""

    afd: AFDConfig
    afd_wire: WireSpec
    model: FFNStack
    afd_placement: ExpertPlacement | None = None
    afd_ffn_rank: int = 0

    def afd_exchange_layers(self) -> tuple[int, ...]:
        """The exchanging decoder layers, in order (see :class:`AttentionRoleMixin`)."""
        return self.afd_wire.exchange_layers

    def afd_init_ffn_role(
        self, stock: StockMoEModel, vllm_config: VllmConfig, prefix: str
    ) -> list[nn.Module]:
        """Set the fields an FFN role model of ``stock`` has (``config``, ``quant_config``,
        ``afd``, ``afd_wire``, ``afd_placement``, ``afd_ffn_rank``) and return the
        ``mlp`` of every decoder layer (:meth:`StockMoEModel.ffn_mlp`), under the
        checkpoint names ``{prefix}.model.layers.N.mlp``. Call it from ``__init__`` after
        ``nn.Module.__init__``; nothing else of the stock model is built.
        """
        config = stock.hf_config(vllm_config)
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.afd = afd_config(vllm_config)
        self.afd_wire = stock.wire_spec(vllm_config, self.afd)
        self.afd_placement = stock.placement(vllm_config, self.afd)
        if self.afd_placement is not None:
            self.afd_ffn_rank = ffn_role_rank(vllm_config, self.afd)
        layers_prefix = f"{maybe_prefix(prefix, 'model')}.layers"
        return [
            stock.ffn_mlp(
                vllm_config,
                self.afd,
                self.afd_placement,
                self.afd_ffn_rank,
                layer,
                f"{layers_prefix}.{layer}.mlp",
            )
            for layer in range(config.num_hidden_layers)
        ]

    def afd_set_expert_fields(self, moe_block: type[nn.Module]) -> None:
        """vLLM's MixtureOfExperts fields as the stock Qwen MoE models set them from their
        ``moe_block`` blocks (``n_logical_experts``, ...; one expert group, no shared
        experts counted); expert-routed: for this rank's experts."""
        if self.afd_placement is not None:
            self.afd_set_local_expert_fields()
            return
        blocks = [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, moe_block)]
        example = blocks[-1]
        self.moe_layers = [block.experts for block in blocks]
        self.num_moe_layers = len(blocks)
        self.num_expert_groups = 1
        self.num_shared_experts = 0
        self.num_logical_experts = example.n_logical_experts
        self.num_physical_experts = example.n_physical_experts
        self.num_local_physical_experts = example.n_local_physical_experts
        self.num_routed_experts = example.n_routed_experts
        self.num_redundant_experts = example.n_redundant_experts

    def afd_set_local_expert_fields(self) -> list[LocalExperts]:
        """Expert-routed: set vLLM's MixtureOfExperts fields for this FFN rank's block of
        experts (one expert group, no shared or redundant experts); return the
        :class:`~afd_models.routed.LocalExperts` of its MoE layers, in layer order."""
        assert self.afd_placement is not None
        local = [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, LocalExperts)]
        count = len(self.afd_placement.block(self.afd_ffn_rank))
        self.moe_layers = [block.experts for block in local]
        self.num_moe_layers = len(local)
        self.num_expert_groups = 1
        self.num_shared_experts = 0
        self.num_logical_experts = self.num_physical_experts = count
        self.num_local_physical_experts = self.num_routed_experts = count
        self.num_redundant_experts = 0
        return local

    def afd_loaded_experts(self) -> dict[str, Any] | None:
        """Expert-routed: the global expert ids this rank's model holds (``block``,
        ``[start, stop]``) and the experts whose weights each MoE layer loaded
        (``per_layer``); None for a model holding every expert."""
        if self.afd_placement is None:
            return None
        block = self.afd_placement.block(self.afd_ffn_rank)
        local = [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, LocalExperts)]
        return {
            "block": [block.start, block.stop],
            "per_layer": [int(m.experts.routed_experts.w13_weight.shape[0]) for m in local],
        }

    def afd_compute_experts(
        self, layer: int, hidden: torch.Tensor, routing: ExpertRouting
    ) -> torch.Tensor:
        """Expert-routed: this rank's experts of MoE layer ``layer`` on ``hidden``.

        ``routing`` has local expert ids; see :func:`afd_models.routed.compute_local_experts`
        (the result is float32 with ``partials_dtype`` ``"float32"``, else the model dtype).
        Raises ValueError for a layer without this rank's experts.
        """
        mlp = self.model.layers[layer].mlp if 0 <= layer < len(self.model.layers) else None
        if not isinstance(mlp, LocalExperts):
            raise ValueError(
                f"AFD FFN: layer {layer} holds no routed experts of this FFN rank (its MoE "
                f"layers are {self.afd_wire.exchange_layers})"
            )
        if not hidden.shape[0]:
            return hidden.clone() if mlp.reference is None else hidden.float()
        return compute_local_experts(mlp, hidden, routing)

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
        kept = role_weights(
            weights,
            "ffn",
            gate_on_attention=self.afd.compute_gate_on_attention,
            placement=self.afd_placement,
            ffn_rank=self.afd_ffn_rank,
        )
        loaded = AutoWeightsLoader(self).load_weights(kept)
        if partials_dtype(self.afd.connector_extra_config) == "float32":
            for layer in self.model.layers:
                if isinstance(layer.mlp, LocalExperts):
                    keep_reference_weights(layer.mlp)
        return loaded
