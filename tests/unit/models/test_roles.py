"""Role dispatch, AFD settings and wire spec of the model wrappers (afd_models.roles).

Plain classes and namespaces stand in for vLLM's; no torch, no vLLM.
"""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from afd_core.config import AFDConfig
from afd_core.errors import AFDConfigError
from afd_models.roles import RoleDispatch, afd_config, make_wire_spec

CONNECTOR = "P2pGlooAFDConnector"


def vllm_config(afd: dict[str, Any] | None = None, **parallel: Any) -> SimpleNamespace:
    """A stand-in VllmConfig with the fields the wrappers read."""
    return SimpleNamespace(
        additional_config={} if afd is None else {"afd": afd},
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=parallel.get("pipeline_parallel_size", 1),
            use_sequence_parallel_moe=parallel.get("use_sequence_parallel_moe", False),
        ),
        model_config=SimpleNamespace(
            dtype=FakeDtype("bfloat16"),
            hf_config=SimpleNamespace(architectures=["Qwen3MoeForCausalLM"]),
            hf_text_config=SimpleNamespace(hidden_size=128, vocab_size=1024),
        ),
    )


class FakeDtype:
    """Prints like a torch dtype."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


class Stock:
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self.built = "stock"


class Wrapper(RoleDispatch, Stock):
    pass


class Attention(Wrapper):
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self.built = "attention"


class FFN(Wrapper):
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        self.built = "ffn"


Wrapper.afd_role_classes = MappingProxyType({"attention": Attention, "ffn": FFN})


def test_wrapper_without_afd_builds_the_stock_class() -> None:
    model = Wrapper(vllm_config=vllm_config())
    assert type(model) is Wrapper
    assert model.built == "stock"


@pytest.mark.parametrize(("role", "cls"), [("attention", Attention), ("ffn", FFN)])
def test_wrapper_with_afd_builds_the_role_class(role: str, cls: type) -> None:
    model = Wrapper(vllm_config=vllm_config({"role": role, "connector": CONNECTOR}))
    assert type(model) is cls
    assert model.built == role


def test_a_role_class_built_directly_does_not_dispatch_again() -> None:
    model = Attention(vllm_config=vllm_config({"role": "ffn", "connector": CONNECTOR}))
    assert type(model) is Attention


def test_afd_config_reads_role_and_gate_placement() -> None:
    config = afd_config(
        vllm_config({"role": "ffn", "connector": CONNECTOR, "compute_gate_on_attention": True})
    )
    assert config is not None
    assert (config.role, config.compute_gate_on_attention) == ("ffn", True)


def test_afd_config_is_none_without_afd_whatever_the_parallelism() -> None:
    assert afd_config(vllm_config(pipeline_parallel_size=2)) is None


def test_afd_config_rejects_pipeline_parallelism() -> None:
    config = vllm_config({"role": "attention", "connector": CONNECTOR}, pipeline_parallel_size=2)
    with pytest.raises(AFDConfigError, match=r"pipeline_parallel_size \(2\) must be 1"):
        afd_config(config)


def test_afd_config_rejects_sequence_parallel_moe() -> None:
    config = vllm_config({"role": "ffn", "connector": CONNECTOR}, use_sequence_parallel_moe=True)
    with pytest.raises(AFDConfigError, match="sequence-parallel MoE is not supported"):
        afd_config(config)


@pytest.mark.parametrize("gate_on_attention", [False, True])
def test_wire_spec_describes_the_checkpoint_and_the_gate_placement(
    gate_on_attention: bool,
) -> None:
    afd = AFDConfig(role="ffn", connector=CONNECTOR, compute_gate_on_attention=gate_on_attention)
    wire = make_wire_spec(
        vllm_config(),
        afd,
        num_layers=2,
        num_experts=8,
        top_k=2,
        router_logits_dtype=FakeDtype("float32"),
    )
    assert wire.hidden_size == 128
    assert wire.dtype == "bfloat16"
    assert wire.num_exchange_layers == 2
    assert wire.exchange_layers == (0, 1)
    assert wire.router_logits_width == (8 if gate_on_attention else 0)
    assert wire.router_logits_dtype == "float32"
    assert wire.model_fingerprint == "Qwen3MoeForCausalLM:h128:l2:e8:v1024"
    assert (wire.num_experts, wire.top_k) == (8, 2)


def test_an_expert_routed_wire_spec_exchanges_the_moe_layers_only() -> None:
    afd = AFDConfig(
        role="attention",
        connector=CONNECTOR,
        compute_gate_on_attention=True,
        expert_placement="balanced",
    )
    wire = make_wire_spec(
        vllm_config(),
        afd,
        num_layers=3,
        num_experts=8,
        top_k=2,
        router_logits_dtype=FakeDtype("float32"),
        dense_layers=(0,),
    )
    assert wire.exchange_layers == (1, 2)
    assert wire.num_exchange_layers == 2
