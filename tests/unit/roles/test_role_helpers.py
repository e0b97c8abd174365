"""afd_core.workers.setup: role ranks, wire specs, connectors, a worker's whole setup."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType, SimpleNamespace

import pytest

from afd_core.connector import WireSpec
from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.plugins.registry import AFDRegistry
from afd_core.plugins.specs import ConnectorSpec, ModelSpec
from afd_core.workers import setup as roles
from tests.unit.roles.fakes import WIRE, RecordingConnector, make_config


def parallel(dp_rank: int = 0, *, dp: int = 1, tp: int = 1, pp: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        data_parallel_rank=dp_rank,
        data_parallel_size=dp,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
    )


@pytest.fixture
def registry(monkeypatch):
    """A registry with the recording connector, a non-connector and two model wrappers."""
    fake = AFDRegistry(
        connectors=MappingProxyType(
            {
                "Recording": ConnectorSpec(
                    "Recording", "tests.unit.roles.fakes:RecordingConnector", ("cpu",)
                ),
                "NotAConnector": ConnectorSpec(
                    "NotAConnector", "tests.unit.roles.fakes:FakeFFNModel", ("cpu",)
                ),
            }
        ),
        workers=MappingProxyType({}),
        models=MappingProxyType(
            {
                "Qwen3MoeForCausalLM": ModelSpec("Qwen3MoeForCausalLM", "m:Q"),
                "DeepseekV2ForCausalLM": ModelSpec("DeepseekV2ForCausalLM", "m:D"),
            }
        ),
    )
    monkeypatch.setattr(roles, "get_registry", lambda: fake)
    return fake


def test_the_attention_rank_is_the_data_parallel_rank():
    config = make_config(attention=4)
    assert roles.resolve_role_rank(config, parallel(dp_rank=3, dp=4)) == 3


def test_an_explicit_role_rank_wins_over_the_data_parallel_rank():
    config = replace(make_config(attention=4), role_rank=2)
    assert roles.resolve_role_rank(config, parallel(dp_rank=0)) == 2


def test_the_ffn_rank_is_the_role_rank_of_a_single_ffn_server():
    config = replace(make_config("ffn", attention=2, ffn=2), role_rank=1)
    assert roles.resolve_role_rank(config, parallel()) == 1


def test_a_rank_outside_the_topology_is_rejected():
    with pytest.raises(AFDConfigError, match=r"attention rank 2 is outside 0..1"):
        roles.resolve_role_rank(make_config(attention=2), parallel(dp_rank=2, dp=3))


@pytest.mark.parametrize(
    ("role", "layout", "fragment"),
    [
        ("ffn", {"tp": 2}, "tensor_parallel_size=2"),
        ("attention", {"pp": 2}, "pipeline_parallel_size=2"),
        ("ffn", {"dp": 2}, "data_parallel_size=2"),
    ],
)
def test_unsupported_parallel_layouts_are_rejected_with_advice(role, layout, fragment):
    with pytest.raises(AFDConfigError, match=fragment) as info:
        roles.check_parallel_layout(make_config(role, attention=2), parallel(**layout))
    assert f"the {role} role" in str(info.value)


def test_data_parallel_attention_is_supported():
    roles.check_parallel_layout(make_config(attention=2), parallel(dp_rank=1, dp=2))


def test_tensor_parallel_attention_is_supported_and_keeps_its_attention_rank():
    config = make_config(attention=2)
    roles.check_parallel_layout(config, parallel(dp_rank=1, dp=2, tp=2))
    # Every TP rank of data-parallel replica 1 is attention rank 1.
    for tp_rank in (0, 1):
        assert roles.resolve_role_rank(config, parallel(dp_rank=1, dp=2, tp=2), tp_rank) == 1


class Wrapper:
    def afd_wire_spec(self) -> WireSpec:
        return WIRE

    def afd_exchange_layers(self) -> tuple[int, ...]:
        return (0, 1, 2)


class FFNWrapper(Wrapper):
    def afd_compute_ffn(self, layer, hidden, router_logits):
        return hidden


def test_the_wire_spec_comes_from_the_model_wrapper(registry):
    assert roles.model_wire_spec(Wrapper(), "Qwen3MoeForCausalLM", "attention") is WIRE
    assert roles.model_wire_spec(FFNWrapper(), "Qwen3MoeForCausalLM", "ffn") is WIRE


def test_a_model_without_the_afd_interface_names_the_architecture_and_supported_ones(registry):
    with pytest.raises(AFDConfigError) as info:
        roles.model_wire_spec(object(), "LlamaForCausalLM", "attention")
    message = str(info.value)
    assert "'LlamaForCausalLM'" in message
    assert "DeepseekV2ForCausalLM, Qwen3MoeForCausalLM" in message


def test_the_ffn_role_needs_its_entry_points_too(registry):
    with pytest.raises(AFDConfigError, match=r"not an AFD ffn model \(it lacks afd_compute_ffn\)"):
        roles.model_wire_spec(Wrapper(), "Qwen3MoeForCausalLM", "ffn")


def test_a_wire_spec_of_the_wrong_type_is_rejected(registry):
    class Broken:
        def afd_wire_spec(self):
            return {"hidden_size": 8}

        def afd_exchange_layers(self):
            return (0,)

    with pytest.raises(AFDConfigError, match=r"not an afd_core.connector.WireSpec"):
        roles.model_wire_spec(Broken(), "Qwen3MoeForCausalLM", "attention")


def test_build_connector_constructs_the_registered_class_for_the_rank(registry):
    connector = roles.build_connector(make_config(attention=2), 1, WIRE)
    assert isinstance(connector, RecordingConnector)
    assert connector.role_rank == 1 and connector.wire is WIRE
    assert not connector.is_initialized


def test_build_connector_rejects_a_registered_class_that_is_not_a_connector(registry):
    config = replace(make_config(), connector="NotAConnector")
    with pytest.raises(AFDInstallError, match=r"not a subclass of afd_core.connector.Connector"):
        roles.build_connector(config, 0, WIRE)


def vllm_config(afd: dict | None, *, dp_rank: int = 0, dp: int = 1) -> SimpleNamespace:
    """A stand-in for vLLM's config: what role_worker_setup reads."""
    return SimpleNamespace(
        additional_config={} if afd is None else {"afd": afd},
        parallel_config=parallel(dp_rank, dp=dp),
        model_config=SimpleNamespace(architecture="Qwen3MoeForCausalLM"),
    )


@pytest.fixture
def installed(registry, monkeypatch):
    """The fake registry also where the AFD config is parsed."""
    import afd_core.plugins.registry

    monkeypatch.setattr(afd_core.plugins.registry, "get_registry", lambda: registry)
    return registry


def test_a_worker_setup_has_the_config_rank_and_wire_spec_and_builds_fresh_connectors(installed):
    afd = {"role": "attention", "connector": "Recording", "num_attention_ranks": 2}
    setup = roles.role_worker_setup(vllm_config(afd, dp_rank=1, dp=2), Wrapper(), "attention", 0)
    assert (setup.config.role, setup.role_rank, setup.wire) == ("attention", 1, WIRE)
    first, second = setup.new_connector(), setup.new_connector()
    assert isinstance(first, RecordingConnector) and first is not second
    assert (first.role_rank, first.wire, first.is_initialized) == (1, WIRE, False)


@pytest.mark.parametrize("role", ["attention", "ffn"])
def test_a_worker_without_an_afd_config_is_told_how_to_give_one(installed, role):
    with pytest.raises(AFDConfigError, match=rf'an "afd" config with "role": "{role}"'):
        roles.role_worker_setup(vllm_config(None), FFNWrapper(), role, 0)


def test_a_worker_setup_checks_the_model_for_its_role(installed):
    afd = {"role": "ffn", "connector": "Recording"}
    with pytest.raises(AFDConfigError, match=r"not an AFD ffn model"):
        roles.role_worker_setup(vllm_config(afd), Wrapper(), "ffn", 0)
