"""Modules and construction helpers shared by the role wrappers.

Attention role: each decoder layer's ``mlp`` is an :class:`ExchangeMLP` (no expert
weights, optionally the router gate). The stock decoder layers build their MLP inline
in ``__init__``, so the wrappers build them while :func:`stand_ins` has put
ExchangeMLP subclasses in place of the stock MLP classes in the vLLM model module; the
attention, norm and residual code stays vLLM's own. :func:`check_attention_role` then
proves that no MoE runner or expert weight was built.

FFN role: an :class:`FFNStack` mirrors the module paths of the checkpoint
(``model.layers.N.mlp``) with stock vLLM MLP/MoE blocks and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

import torch
from torch import nn
from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import (
    MoERunnerInterface,
)
from vllm.model_executor.models.utils import extract_layer_index

import afd_models.exchange_op  # noqa: F401  (registers torch.ops.afd.exchange)
from afd_core.errors import AFDInstallError


class ExchangeMLP(nn.Module):
    """The attention role's MLP of decoder layer ``layer``: the exchange with the FFN role.

    ``gate`` is the MoE router gate when it runs on the attention role (its parameter
    keeps the checkpoint name ``...mlp.gate.weight``); the router logits then travel
    with the hidden states. Without a gate the module has no parameters.
    """

    def __init__(self, layer: int, gate: nn.Module | None = None) -> None:
        super().__init__()
        self.layer = layer
        self.gate = gate

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits = None
        if self.gate is not None:
            router_logits, _ = self.gate(hidden_states)
        return torch.ops.afd.exchange(hidden_states, router_logits, self.layer)


class DenseExchangeMLP(ExchangeMLP):
    """Stands in for a dense MLP class (``Qwen3MoeMLP``, ``DeepseekV2MLP``) during
    construction of the attention role; takes the stock keyword arguments."""

    def __init__(self, *, prefix: str, **_stock_kwargs: object) -> None:
        super().__init__(layer=extract_layer_index(prefix))


@contextmanager
def stand_ins(module: ModuleType, **replacements: Callable[..., nn.Module]) -> Iterator[None]:
    """Within the block, the classes (or factories, such as ``FusedMoEFactory``) named in
    ``replacements`` resolve, inside the vLLM model ``module``, to the given stand-ins;
    the originals come back on exit.

    Raises AFDInstallError (before changing anything) when a name is not a class or
    function of ``module``: that vLLM version builds its layers differently.
    """
    originals: dict[str, Callable[..., nn.Module]] = {}
    for name in replacements:
        original = vars(module).get(name)
        if not callable(original):
            raise AFDInstallError(
                f"AFD: {module.__name__} has no class or function {name}, so afd-models "
                "cannot build the roles of this model; install the vLLM version afd-models "
                "supports (0.32)"
            )
        originals[name] = original
    try:
        for name, stand_in in replacements.items():
            setattr(module, name, stand_in)
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


def check_attention_role(
    layers: Sequence[nn.Module], model_name: str, routed_layers: Sequence[int] | None
) -> None:
    """Raise AFDInstallError unless the attention role's layers are what its stand-ins
    build, and no layer built an MoE runner (which would hold expert weights and register
    itself with vLLM).

    ``routed_layers`` None: every layer's ``mlp`` is an ExchangeMLP. Otherwise (an
    expert-routed deployment's MoE layers) each of those layers' ``mlp.experts`` is a
    :class:`~afd_models.routed.RoutedExchange`.
    """
    from afd_models.routed import RoutedExchange

    for index, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if routed_layers is None:
            part, built, wanted, name = "layer", mlp, ExchangeMLP, "the exchange"
        else:
            part, wanted, name = "MoE layer", RoutedExchange, "the routed exchange"
            built = getattr(mlp, "experts", None)
        if (routed_layers is None or index in routed_layers) and not isinstance(built, wanted):
            raise AFDInstallError(
                f"AFD: {part} {index} of the attention role of {model_name} built "
                f"{type(built).__name__} instead of {name}; this vLLM version is not "
                "supported by afd-models"
            )
        if any(isinstance(m, MoERunnerInterface) for m in layer.modules()):
            raise AFDInstallError(
                f"AFD: layer {index} of the attention role of {model_name} built an MoE "
                "runner; this vLLM version is not supported by afd-models"
            )


def detach_gate(block: nn.Module) -> None:
    """Take the router gate out of a stock MoE block built for the FFN role.

    Used when the gate runs on the attention role: the block's MoE runner then routes
    with the router logits passed to it, exactly as it does with the logits it computes
    itself. A DeepSeek-V3 routing bias stays loadable at ``mlp.gate.e_score_correction_bias``
    (the runner's router adds it during top-k, on the FFN role).
    """
    bias = getattr(block.gate, "e_score_correction_bias", None)
    block.experts.gate = None
    if bias is None:
        del block.gate
        return
    holder = nn.Module()
    holder.e_score_correction_bias = bias
    # Replaced in place, the module keeps its position, so the bias (also held by the
    # runner's routed experts) keeps its checkpoint name in named_parameters().
    block.gate = holder


class NoMLP(nn.Module):
    """The ``mlp`` of a decoder layer whose MLP the FFN role does not hold (expert-routed
    deployments: dense layers run on the attention role)."""


class FFNLayer(nn.Module):
    """One decoder layer of the FFN role: just its ``mlp``."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.mlp = mlp


class FFNStack(nn.Module):
    """The FFN role's ``model``: ``layers[N].mlp`` for every decoder layer N."""

    def __init__(self, mlps: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FFNLayer(mlp) for mlp in mlps)
