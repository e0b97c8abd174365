"""parse_afd_config / afd_config_from_vllm: every rule accepted once and rejected once."""

from __future__ import annotations

import sys
import types
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from afd_core.config import ALIASES, KEYS, AFDConfig, afd_config_from_vllm, parse_afd_config
from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.kit.pairing import ALL_TO_ALL, BLOCK
from tests.unit.core.fake_connectors import CONNECTORS

BASE = {"role": "attention", "connector": "FakeP2P"}
_UNSET: Any = object()


def parse(raw: Any = _UNSET, **changes: Any) -> AFDConfig:
    """Parse BASE updated with ``changes`` (or ``raw`` as given) against the fake registry."""
    settings = dict(BASE) | changes if raw is _UNSET else raw
    return parse_afd_config(settings, connectors=CONNECTORS)


def rejected(
    *fragments: str, raw: Any = _UNSET, prefix: str = "AFD config:", **changes: Any
) -> str:
    """Assert that parsing fails with a one-line message holding every fragment."""
    with pytest.raises(AFDConfigError) as info:
        parse(raw, **changes)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("AFD config: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# Defaults and result ----------------------------------------------------------------


def test_minimal_config_gets_the_documented_defaults() -> None:
    config = parse()
    assert config == AFDConfig(role="attention", connector="FakeP2P")
    assert (config.host, config.port, config.afd_process_group_timeout_s) == (
        "127.0.0.1",
        29600,
        120,
    )
    assert (config.num_attention_ranks, config.num_ffn_ranks) == (1, 1)
    assert config.async_dp is False
    assert config.compute_gate_on_attention is False
    assert dict(config.connector_extra_config) == {}
    assert config.role_rank is None


def test_full_config_is_parsed_into_every_field() -> None:
    config = parse(
        role="ffn",
        host="10.0.0.5",
        port=30000,
        afd_process_group_timeout_s=60,
        num_attention_ranks=4,
        num_ffn_ranks=2,
        compute_gate_on_attention=True,
        connector_extra_config={"depth": 3},
        role_rank=1,
    )
    assert config == AFDConfig(
        role="ffn",
        connector="FakeP2P",
        host="10.0.0.5",
        port=30000,
        num_attention_ranks=4,
        num_ffn_ranks=2,
        async_dp=False,
        afd_process_group_timeout_s=60,
        compute_gate_on_attention=True,
        connector_extra_config={"depth": 3},
        role_rank=1,
    )


def test_keys_constant_matches_the_dataclass_fields() -> None:
    # ``expert_placement`` comes from the connector's pattern, not from a key.
    assert set(KEYS) == set(AFDConfig.__dataclass_fields__) - {"expert_placement"}


@pytest.mark.parametrize("raw", [["role", "ffn"], "role=ffn", None, 3])
def test_settings_that_are_not_a_mapping_are_rejected(raw: Any) -> None:
    rejected('additional_config["afd"] must be a mapping', raw=raw)


# role -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["attention", "ffn"])
def test_role_accepts_attention_and_ffn(role: str) -> None:
    assert parse(role=role).role == role


def test_missing_role_is_rejected() -> None:
    rejected("role is missing", '"attention"', '"ffn"', raw={"connector": "FakeP2P"})


@pytest.mark.parametrize("role", ["atention", "Attention", "", 1, None, ["ffn"]])
def test_role_outside_attention_and_ffn_is_rejected(role: Any) -> None:
    rejected("role must be", repr(role), role=role)


def test_expected_role_that_matches_is_accepted() -> None:
    config = parse_afd_config(BASE | {"role": "ffn"}, connectors=CONNECTORS, expected_role="ffn")
    assert config.role == "ffn"


def test_expected_role_that_differs_is_a_role_mismatch() -> None:
    with pytest.raises(AFDConfigError) as info:
        parse_afd_config(BASE, connectors=CONNECTORS, expected_role="ffn")
    assert str(info.value).startswith(
        'AFD role mismatch: this worker runs the ffn role but additional_config["afd"]["role"] '
        'is "attention"; '
    )
    assert "\n" not in str(info.value)


# connector --------------------------------------------------------------------------


def test_registered_connector_is_accepted() -> None:
    assert parse(connector="FakePlain").connector == "FakePlain"


def test_missing_connector_is_rejected_with_the_registered_names_sorted() -> None:
    names = ", ".join(sorted(CONNECTORS))
    rejected("connector is missing", names, raw={"role": "ffn"})


@pytest.mark.parametrize("name", ["NoSuchConnector", "fakep2p", 7, None])
def test_unregistered_connector_is_rejected_with_the_registered_names_sorted(name: Any) -> None:
    names = ", ".join(sorted(CONNECTORS))
    rejected("connector", repr(name), "is not registered", names, connector=name)


def test_connector_is_rejected_when_no_connector_is_registered() -> None:
    with pytest.raises(AFDConfigError, match=r"registered connectors: \(none"):
        parse_afd_config(BASE, connectors={})


def test_connectors_default_to_the_installed_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = types.ModuleType("afd_core.plugins.registry")
    registry.get_registry = lambda: SimpleNamespace(  # type: ignore[attr-defined]
        connectors={"FakePlain": CONNECTORS["FakePlain"]}
    )
    monkeypatch.setitem(sys.modules, "afd_core.plugins.registry", registry)
    assert parse_afd_config(BASE | {"connector": "FakePlain"}).connector == "FakePlain"
    with pytest.raises(AFDConfigError, match="registered connectors: FakePlain;"):
        parse_afd_config(BASE)


# async_dp ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, "true", "on"])
def test_async_dp_is_accepted_with_an_async_dp_connector(value: Any) -> None:
    assert parse(connector="FakeAsync", async_dp=value).async_dp is True


def test_async_dp_true_with_a_synchronous_connector_is_rejected() -> None:
    rejected("async_dp (true)", "FakeAsync", "'FakeP2P'", async_dp=True)


@pytest.mark.parametrize("changes", [{}, {"async_dp": False}, {"async_dp": "no"}])
def test_async_dp_connector_without_async_dp_is_rejected(changes: dict[str, Any]) -> None:
    rejected("'FakeAsync' requires async_dp true", connector="FakeAsync", **changes)


@pytest.mark.parametrize("value", [1, 0, 1.0, "maybe", None])
def test_async_dp_that_is_not_a_bool_is_rejected(value: Any) -> None:
    rejected("async_dp must be true or false", repr(value), async_dp=value)


# host -------------------------------------------------------------------------------


def test_host_is_stripped() -> None:
    assert parse(host="  node-0.example  ").host == "node-0.example"


@pytest.mark.parametrize("host", ["", "   "])
def test_empty_host_is_rejected(host: str) -> None:
    rejected("host must not be empty", repr(host), host=host)


@pytest.mark.parametrize("host", [127001, None, ["127.0.0.1"]])
def test_host_that_is_not_a_string_is_rejected(host: Any) -> None:
    rejected("host must be a string", repr(host), host=host)


# port -------------------------------------------------------------------------------


@pytest.mark.parametrize(("port", "expected"), [(1, 1), (65535, 65535), ("8080", 8080)])
def test_port_in_range_is_accepted(port: Any, expected: int) -> None:
    assert parse(port=port).port == expected


@pytest.mark.parametrize("port", [0, -1, 65536, "70000"])
def test_port_out_of_range_is_rejected(port: Any) -> None:
    rejected(f"port ({int(port)}) must be in 1..65535", port=port)


def test_float_port_is_rejected_with_the_integer_to_write() -> None:
    message = rejected(port=8080.0)
    assert message == ("AFD config: port must be an integer, got 8080.0 (float); write it as 8080")


@pytest.mark.parametrize("port", [8080.5, True, "80a", "8080.0", None])
def test_port_that_is_not_an_integer_is_rejected(port: Any) -> None:
    rejected("port must be an integer", repr(port), port=port)


# afd_process_group_timeout_s ---------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(1, 1), ("300", 300)])
def test_positive_timeout_is_accepted(value: Any, expected: int) -> None:
    assert parse(afd_process_group_timeout_s=value).afd_process_group_timeout_s == expected


@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_timeout_is_rejected(value: int) -> None:
    rejected(
        f"afd_process_group_timeout_s ({value}) must be >= 1", afd_process_group_timeout_s=value
    )


@pytest.mark.parametrize("value", [1.5, True, "2m"])
def test_timeout_that_is_not_an_integer_is_rejected(value: Any) -> None:
    rejected("afd_process_group_timeout_s must be an integer", afd_process_group_timeout_s=value)


# rank counts and topology -------------------------------------------------------------


@pytest.mark.parametrize(("a", "f"), [(3, 2), (2, 2), ("4", "1")])
def test_attention_ranks_at_least_ffn_ranks_are_accepted(a: Any, f: Any) -> None:
    config = parse(num_attention_ranks=a, num_ffn_ranks=f)
    assert config.topology.num_attention_ranks == int(a)
    assert config.topology.num_ffn_ranks == int(f)


@pytest.mark.parametrize("key", ["num_attention_ranks", "num_ffn_ranks"])
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_rank_count_is_rejected(key: str, value: int) -> None:
    rejected(f"{key} ({value}) must be >= 1", **{key: value})


@pytest.mark.parametrize("key", ["num_attention_ranks", "num_ffn_ranks"])
def test_rank_count_that_is_not_an_integer_is_rejected(key: str) -> None:
    rejected(f"{key} must be an integer", "2.0 (float)", **{key: 2.0})


def test_fewer_attention_ranks_than_ffn_ranks_is_rejected() -> None:
    rejected(
        "num_attention_ranks (1) must be >= num_ffn_ranks (2)",
        "use fewer FFN ranks",
        num_attention_ranks=1,
        num_ffn_ranks=2,
    )


# compute_gate_on_attention ------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("on", True), ("FALSE", False)])
def test_compute_gate_on_attention_accepts_bools_and_bool_words(value: Any, expected: bool) -> None:
    assert parse(compute_gate_on_attention=value).compute_gate_on_attention is expected


@pytest.mark.parametrize("value", [1, 0.0, "maybe"])
def test_compute_gate_on_attention_that_is_not_a_bool_is_rejected(value: Any) -> None:
    rejected("compute_gate_on_attention must be true or false", compute_gate_on_attention=value)


# connector_extra_config ---------------------------------------------------------------


def test_extra_config_accepted_by_the_connector_is_stored_read_only() -> None:
    config = parse(connector_extra_config={"depth": 4})
    assert config.connector_extra_config == {"depth": 4}
    assert isinstance(config.connector_extra_config, MappingProxyType)
    with pytest.raises(TypeError):
        config.connector_extra_config["depth"] = 5  # type: ignore[index]


def test_extra_config_is_a_copy_of_the_callers_mapping() -> None:
    extra: dict[str, Any] = {"depth": 4}
    config = parse(connector_extra_config=extra)
    extra["depth"] = 9
    assert config.connector_extra_config == {"depth": 4}


@pytest.mark.parametrize("extra", [["depth", 4], "depth=4", 4])
def test_extra_config_that_is_not_a_mapping_is_rejected(extra: Any) -> None:
    rejected("connector_extra_config must be a mapping", repr(extra), connector_extra_config=extra)


def test_extra_config_field_unknown_to_the_connector_is_rejected() -> None:
    rejected("connector_extra_config", "['width']", connector_extra_config={"width": 2})


def test_extra_config_field_of_the_wrong_type_is_rejected() -> None:
    rejected(
        "connector_extra_config.depth must be an integer",
        "'deep'",
        connector_extra_config={"depth": "deep"},
    )


def test_connector_without_extra_settings_rejects_any_field() -> None:
    assert parse(connector="FakePlain", connector_extra_config={}).connector == "FakePlain"
    rejected("['x']", "takes none", connector="FakePlain", connector_extra_config={"x": 1})


def test_plain_value_error_of_a_third_party_parser_becomes_a_one_line_config_error() -> None:
    rejected(
        "rejected by FakeSloppy: bad extra config second line",
        connector="FakeSloppy",
        connector_extra_config={"x": 1},
    )


def test_connector_spec_that_is_not_a_connector_class_is_an_install_error() -> None:
    with pytest.raises(AFDInstallError, match=r"not a subclass of afd_core\.connector\.Connector"):
        parse(connector="FakeNotAConnector")


def test_a_connector_class_without_a_pattern_type_is_a_plugin_error() -> None:
    with pytest.raises(AFDInstallError, match=r"sets no pattern_type.*fix the plugin"):
        parse(connector="FakeNoPattern")


def test_the_pattern_decides_the_rank_map_and_the_expert_split() -> None:
    block = parse(connector="FakeP2P")
    assert block.expert_placement is None and block.topology.pairing == BLOCK
    routed = parse(connector="FakeExpert", compute_gate_on_attention=True)
    assert routed.expert_placement == "balanced" and routed.topology.pairing == ALL_TO_ALL


def test_connector_whose_package_is_missing_is_an_install_error() -> None:
    with pytest.raises(AFDInstallError, match="afd_not_installed_anywhere"):
        parse(connector="FakeUninstalled")


# role_rank --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "value", "expected"),
    [
        ("attention", None, None),
        ("attention", 0, 0),
        ("attention", 3, 3),
        ("attention", "2", 2),
        ("ffn", 1, 1),
    ],
)
def test_role_rank_inside_the_roles_rank_count_is_accepted(
    role: str, value: Any, expected: int | None
) -> None:
    config = parse(role=role, num_attention_ranks=4, num_ffn_ranks=2, role_rank=value)
    assert config.role_rank == expected


@pytest.mark.parametrize(
    ("role", "value", "count_key"),
    [
        ("attention", 4, "num_attention_ranks=4"),
        ("attention", -1, "num_attention_ranks=4"),
        ("ffn", 2, "num_ffn_ranks=2"),
    ],
)
def test_role_rank_outside_the_roles_rank_count_is_rejected(
    role: str, value: int, count_key: str
) -> None:
    rejected(
        f"role_rank ({value}) must be in",
        count_key,
        role=role,
        num_attention_ranks=4,
        num_ffn_ranks=2,
        role_rank=value,
    )


@pytest.mark.parametrize("value", [1.0, True, "first"])
def test_role_rank_that_is_not_an_integer_is_rejected(value: Any) -> None:
    rejected("role_rank must be an integer", role_rank=value)


def test_ffn_cuda_graphs_defaults_to_128_and_accepts_zero() -> None:
    assert parse().ffn_cuda_graphs == 128
    assert parse(ffn_cuda_graphs=0).ffn_cuda_graphs == 0


def test_ffn_cuda_graphs_that_is_not_a_count_is_rejected() -> None:
    rejected(
        "ffn_cuda_graphs (-1) must be >= 0", "CUDA graph an FFN rank keeps", ffn_cuda_graphs=-1
    )
    rejected("ffn_cuda_graphs must be an integer", ffn_cuda_graphs="many")


# aliases and unknown keys -------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "value", "field", "expected"),
    [
        ("afd_role", "ffn", "role", "ffn"),
        ("afd_connector", "FakePlain", "connector", "FakePlain"),
        ("afd_host", "node1", "host", "node1"),
        ("afd_port", "4000", "port", 4000),
    ],
)
def test_alias_sets_its_key(alias: str, value: Any, field: str, expected: Any) -> None:
    settings = dict(BASE)
    settings.pop(field, None)
    config = parse(raw=settings | {alias: value})
    assert getattr(config, field) == expected


def test_async_alias_sets_async_dp() -> None:
    assert parse(connector="FakeAsync", **{"async": "yes"}).async_dp is True


@pytest.mark.parametrize(("alias", "key"), sorted(ALIASES.items()))
def test_alias_and_its_key_together_are_rejected(alias: str, key: str) -> None:
    rejected(repr(alias), repr(key), f"keep only {key!r}", raw=BASE | {key: "x", alias: "y"})


def test_alias_clash_is_reported_whatever_the_order_of_the_keys() -> None:
    raw = {"afd_port": 1, "role": "ffn", "connector": "FakeP2P", "port": 2}
    rejected("'afd_port' (set to 1) and 'port' (set to 2) both set port", raw=raw)


def test_unknown_key_is_rejected_with_the_valid_keys_and_where_connector_settings_go() -> None:
    message = rejected(
        "unknown key 'depth' (set to 4)",
        "connector-specific settings go in connector_extra_config",
        depth=4,
    )
    for key in (*KEYS, *ALIASES):
        assert key in message


def test_nested_afd_key_is_an_unknown_key() -> None:
    rejected("unknown key 'afd'", raw={"afd": BASE})


# afd_config_from_vllm ----------------------------------------------------------------


@pytest.mark.parametrize(
    "vllm_config",
    [
        object(),
        SimpleNamespace(additional_config=None),
        SimpleNamespace(additional_config={}),
        SimpleNamespace(additional_config={"gdn_prefill_backend": "x"}),
        SimpleNamespace(additional_config="afd"),
    ],
)
def test_without_an_afd_key_afd_is_off(vllm_config: Any) -> None:
    assert afd_config_from_vllm(vllm_config, connectors=CONNECTORS) is None


def test_afd_key_turns_afd_on() -> None:
    vllm_config = SimpleNamespace(additional_config={"afd": BASE, "other": 1})
    config = afd_config_from_vllm(vllm_config, connectors=CONNECTORS)
    assert config == AFDConfig(role="attention", connector="FakeP2P")


def test_from_vllm_checks_the_expected_role() -> None:
    vllm_config = SimpleNamespace(additional_config={"afd": BASE})
    with pytest.raises(AFDConfigError, match=r"^AFD role mismatch: "):
        afd_config_from_vllm(vllm_config, connectors=CONNECTORS, expected_role="ffn")


@pytest.mark.parametrize("value", [None, "ffn", ["role", "ffn"]])
def test_afd_value_that_is_not_a_mapping_is_rejected(value: Any) -> None:
    vllm_config = SimpleNamespace(additional_config={"afd": value})
    with pytest.raises(AFDConfigError, match=r'^AFD config: additional_config\["afd"\] must be'):
        afd_config_from_vllm(vllm_config, connectors=CONNECTORS)


def test_an_expert_routed_connector_requires_the_gate_on_attention() -> None:
    rejected(
        "connector 'FakeExpert' routes every token",
        "requires compute_gate_on_attention true, got false",
        '"compute_gate_on_attention": true',
        raw={"role": "ffn", "connector": "FakeExpert"},
    )


def test_a_connector_whose_data_carries_no_routing_refuses_the_gate_on_attention() -> None:
    rejected(
        "connector 'FakeGateOnFFN' moves hidden states only",
        "requires compute_gate_on_attention false, got true",
        '"compute_gate_on_attention": false',
        raw={"role": "ffn", "connector": "FakeGateOnFFN", "compute_gate_on_attention": True},
    )


def test_an_expert_routed_connector_takes_more_ffn_ranks_than_attention_ranks() -> None:
    config = parse(
        connector="FakeExpert",
        compute_gate_on_attention=True,
        num_attention_ranks=1,
        num_ffn_ranks=3,
        role_rank=0,
    )
    assert config.splits_experts and config.expert_placement == "balanced"
    assert tuple(config.topology.block_of(2)) == (0,)


def test_a_block_connector_names_itself_when_it_has_too_many_ffn_ranks() -> None:
    rejected(
        "num_attention_ranks (1) must be >= num_ffn_ranks (2)",
        "FakeP2P pairs ranks in blocks",
        raw=BASE | {"num_ffn_ranks": 2},
    )


def test_ffn_idle_limit_defaults_to_600_s_accepts_zero_and_rejects_negatives() -> None:
    assert parse().ffn_idle_limit_s == 600
    assert parse(ffn_idle_limit_s=0).ffn_idle_limit_s == 0
    rejected(
        "ffn_idle_limit_s (-5) must be >= 0", "waits for new attention ranks", ffn_idle_limit_s=-5
    )
    # Each FFN rank may choose its own: it is not part of what the roles compare.
    assert "ffn_idle_limit_s" not in parse().shared_view()


# Stages ----------------------------------------------------------------------------------


def test_one_stage_per_step_is_the_default_with_vllms_dbo_thresholds() -> None:
    config = parse()
    assert config.num_stages == 1
    assert (config.stage_decode_token_threshold, config.stage_prefill_token_threshold) == (32, 512)
    assert config.stage_policy.threshold(decode_only=True) == 32


@pytest.mark.parametrize(("value", "expected"), [(1, 1), (2, 2), ("2", 2)])
def test_num_stages_accepts_one_or_two(value: Any, expected: int) -> None:
    assert parse(num_stages=value).num_stages == expected


@pytest.mark.parametrize("value", [0, 3])
def test_num_stages_other_than_one_or_two_is_rejected(value: int) -> None:
    rejected(f"num_stages ({value}) must be in 1..2", "use 1", num_stages=value)


def test_stage_thresholds_make_the_stage_policy() -> None:
    config = parse(num_stages=2, stage_decode_token_threshold=4, stage_prefill_token_threshold="9")
    assert config.stage_policy.threshold(decode_only=True) == 4
    assert config.stage_policy.threshold(decode_only=False) == 9


@pytest.mark.parametrize("key", ["stage_decode_token_threshold", "stage_prefill_token_threshold"])
def test_a_stage_threshold_below_two_tokens_is_rejected(key: str) -> None:
    rejected(f"{key} (1) must be >= 2", "fewest tokens", **{key: 1})


def test_num_stages_is_a_setting_both_roles_share_but_the_thresholds_are_not() -> None:
    shared = parse(num_stages=2, stage_decode_token_threshold=4).shared_view()
    assert shared["num_stages"] == 2
    assert not any(key.startswith("stage_") for key in shared)


def test_the_stages_share_the_workers_cuda_stream_unless_each_has_its_own() -> None:
    assert parse().stage_streams == "shared"
    assert parse(num_stages=2, stage_streams="per-stage").stage_streams == "per-stage"
    assert "stage_streams" not in parse(stage_streams="per-stage").shared_view()


@pytest.mark.parametrize("value", ["per_stage", 2, None])
def test_stage_streams_other_than_per_stage_or_shared_is_rejected(value: Any) -> None:
    rejected(
        "stage_streams must be 'per-stage' or 'shared'", 'use "per-stage"', stage_streams=value
    )
