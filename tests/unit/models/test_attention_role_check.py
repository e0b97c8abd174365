"""The attention role's construction check (afd_models.layers.check_attention_role):
what each layout must build, and that nothing builds an MoE runner. Real torch modules
(the role's own ExchangeMLP and RoutedExchange); plain ``nn.Module``s stand in for vLLM's
decoder layers."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from torch import nn

from afd_core.errors import AFDInstallError
from afd_models.layers import ExchangeMLP, check_attention_role
from afd_models.routed import RoutedExchange


def layer(mlp: nn.Module) -> nn.Module:
    block = nn.Module()
    block.mlp = mlp
    return block


def routed(index: int) -> nn.Module:
    mlp = nn.Module()
    mlp.experts = RoutedExchange(
        layer=index, gate=nn.Identity(), router=nn.Identity(), shared_experts=None,
        routed_scaling_factor=1.0,
    )  # fmt: skip
    return mlp


def test_a_block_layout_needs_the_exchange_in_every_layer() -> None:
    check_attention_role([layer(ExchangeMLP(0)), layer(ExchangeMLP(1))], "M", None)
    with pytest.raises(AFDInstallError, match="layer 1 of the attention role of M built Linear "
                       "instead of the exchange"):  # fmt: skip
        check_attention_role([layer(ExchangeMLP(0)), layer(nn.Linear(2, 2))], "M", None)


def test_an_expert_routed_layout_needs_the_routed_exchange_in_its_moe_layers_only() -> None:
    dense = layer(nn.Linear(2, 2))  # a dense layer stays local
    check_attention_role([dense, layer(routed(1))], "M", routed_layers=[1])
    with pytest.raises(AFDInstallError, match="MoE layer 0 of the attention role of M built "
                       "NoneType instead of the routed exchange"):  # fmt: skip
        check_attention_role([dense, layer(routed(1))], "M", routed_layers=[0, 1])


def test_an_moe_runner_anywhere_is_refused() -> None:
    from vllm.model_executor.layers.fused_moe.runner.moe_runner_interface import (
        MoERunnerInterface,
    )

    class Runner(MoERunnerInterface, nn.Module):  # type: ignore[misc]
        pass

    Runner.__abstractmethods__ = frozenset()
    with_runner = layer(ExchangeMLP(0))
    with_runner.runner = Runner()
    with pytest.raises(AFDInstallError, match="layer 0 of the attention role of M built an MoE"):
        check_attention_role([with_runner], "M", None)
