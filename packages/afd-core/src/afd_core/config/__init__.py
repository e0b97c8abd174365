"""``AFDConfig``: the validated form of ``vllm_config.additional_config["afd"]``.

The presence of the ``"afd"`` key turns AFD on. :func:`parse_afd_config` turns the raw
mapping into an :class:`AFDConfig` (aliases, coercion, validation against the connector
registry and the chosen connector's own ``connector_extra_config`` parser);
:func:`afd_config_from_vllm` reads it from a vLLM config. Every problem raises
:class:`~afd_core.errors.AFDConfigError` with one line that names the key and the value
and says what to do. docs/configuration.md is the user-facing reference of every key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, cast

from afd_core.capabilities import check_connector
from afd_core.config.coercion import (
    show,
    to_bool,
    to_int_at_least,
    to_int_in_range,
    to_mapping,
    to_str,
)
from afd_core.config.stages import (
    DEFAULT_DECODE_TOKEN_THRESHOLD,
    DEFAULT_PREFILL_TOKEN_THRESHOLD,
    MIN_TOKEN_THRESHOLD,
    STAGE_STREAMS,
    StagePolicy,
    StageStreams,
)
from afd_core.connector import Connector
from afd_core.errors import AFDConfigError, AFDInstallError
from afd_core.kit.pairing import ALL_TO_ALL, BLOCK
from afd_core.placement import PlacementRule
from afd_core.plugins.specs import ConnectorSpec
from afd_core.topology import ROLES, Role, Topology

#: Every key ``additional_config["afd"]`` accepts, in documentation order.
KEYS: tuple[str, ...] = (
    "role",
    "connector",
    "async_dp",
    "host",
    "port",
    "afd_process_group_timeout_s",
    "num_attention_ranks",
    "num_ffn_ranks",
    "compute_gate_on_attention",
    "connector_extra_config",
    "role_rank",
    "ffn_cuda_graphs",
    "ffn_idle_limit_s",
    "num_stages",
    "stage_decode_token_threshold",
    "stage_prefill_token_threshold",
    "stage_streams",
)

#: Alternative spellings (alias -> key); an alias and its key must not both be set.
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "afd_role": "role",
        "afd_connector": "connector",
        "afd_host": "host",
        "afd_port": "port",
        "async": "async_dp",
    }
)


@dataclass(frozen=True)
class AFDConfig:
    """One role's AFD settings, validated.

    ``connector_extra_config`` is kept raw here (read-only); the selected connector class
    parses it strictly (``Connector.parse_extra_config``) during validation.
    ``role_rank`` overrides the rank derived from vLLM's data-parallel rank (for
    deployments whose attention ranks are separate servers). ``ffn_cuda_graphs`` bounds
    the CUDA graphs an FFN rank keeps, one per step shape (0: serve graph steps eagerly).
    ``ffn_idle_limit_s`` bounds how long an FFN rank whose attention ranks all left waits
    at a new rendezvous for their replacements (0: it ends instead).
    ``num_stages`` is the number of micro-batch stages per step (1, or 2 so that one
    stage's FFN round trip overlaps the other's attention); the attention role splits a
    step only from the ``stage_*_token_threshold`` token counts (:attr:`stage_policy`).
    ``stage_streams`` says where a two-stage step's kernels queue on CUDA: ``"shared"``
    (both on the worker's stream, the default) or ``"per-stage"`` (each stage on its own
    stream, ordered against the worker's stream by events at the step's start and end;
    exact on an H100, not yet shown faster); it changes nothing on CPU.
    ``expert_placement`` is not a key: it is the connector's pattern's
    (:attr:`Connector.pattern_type <afd_core.connector.Connector.pattern_type>`), None
    when every FFN rank holds every expert, else the rule that splits the routed experts
    over the FFN ranks (:mod:`afd_core.placement`); it decides the rank map
    (:attr:`topology`) and what each role builds (:attr:`splits_experts`).
    """

    role: Role
    connector: str
    host: str = "127.0.0.1"
    port: int = 29600
    num_attention_ranks: int = 1
    num_ffn_ranks: int = 1
    async_dp: bool = False
    afd_process_group_timeout_s: int = 120
    compute_gate_on_attention: bool = False
    connector_extra_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    role_rank: int | None = None
    ffn_cuda_graphs: int = 128
    ffn_idle_limit_s: int = 600
    num_stages: int = 1
    stage_decode_token_threshold: int = DEFAULT_DECODE_TOKEN_THRESHOLD
    stage_prefill_token_threshold: int = DEFAULT_PREFILL_TOKEN_THRESHOLD
    stage_streams: StageStreams = "shared"
    expert_placement: PlacementRule | None = None

    @property
    def splits_experts(self) -> bool:
        """True when the routed experts are split over the FFN ranks (each attention rank
        then sends every token to the FFN ranks of its experts), False when every FFN
        rank holds every expert."""
        return self.expert_placement is not None

    @property
    def topology(self) -> Topology:
        """The rank map of this deployment."""
        pairing = ALL_TO_ALL if self.splits_experts else BLOCK
        return Topology(self.num_attention_ranks, self.num_ffn_ranks, pairing)

    @property
    def stage_policy(self) -> StagePolicy:
        """When a step splits into two stages (with ``num_stages`` 2)."""
        return StagePolicy(
            decode_token_threshold=self.stage_decode_token_threshold,
            prefill_token_threshold=self.stage_prefill_token_threshold,
        )

    def shared_view(self) -> dict[str, Any]:
        """The settings both roles must agree on (compared at rendezvous)."""
        return {
            "connector": self.connector,
            "num_attention_ranks": self.num_attention_ranks,
            "num_ffn_ranks": self.num_ffn_ranks,
            "async_dp": self.async_dp,
            "compute_gate_on_attention": self.compute_gate_on_attention,
            "num_stages": self.num_stages,
            "connector_extra_config": dict(self.connector_extra_config),
        }


def afd_config_from_vllm(
    vllm_config: Any,
    *,
    connectors: Mapping[str, ConnectorSpec] | None = None,
    expected_role: Role | None = None,
) -> AFDConfig | None:
    """The AFD config of ``vllm_config``, or ``None`` when AFD is off.

    Reads ``vllm_config.additional_config`` (duck-typed). AFD is off when that attribute
    is missing, ``None``, not a mapping (vLLM also allows a hashable object there) or has
    no ``"afd"`` key; otherwise the ``"afd"`` value goes through :func:`parse_afd_config`
    with ``connectors`` and ``expected_role``, and its errors propagate.
    """
    additional = getattr(vllm_config, "additional_config", None)
    if not isinstance(additional, Mapping) or "afd" not in additional:
        return None
    return parse_afd_config(additional["afd"], connectors=connectors, expected_role=expected_role)


def parse_afd_config(
    raw: Mapping[str, Any],
    *,
    connectors: Mapping[str, ConnectorSpec] | None = None,
    expected_role: Role | None = None,
) -> AFDConfig:
    """Validate ``raw`` (the value of ``additional_config["afd"]``) into an AFDConfig.

    ``connectors`` maps registered connector names to specs; ``None`` means the installed
    plugins' registry (``afd_core.plugins.registry.get_registry().connectors``). When
    ``expected_role`` is given, a config for the other role is an error ("AFD role
    mismatch"). The selected connector class is imported to parse
    ``connector_extra_config`` strictly. A missing key takes the default of its
    :class:`AFDConfig` field. Raises AFDConfigError for the first invalid key or value,
    AFDInstallError when the connector class cannot be loaded.
    """
    values = _canonical_keys(
        to_mapping(
            'additional_config["afd"]',
            raw,
            'write it as {"role": "attention" or "ffn", "connector": NAME, ...}',
        )
    )
    role = _parse_role(values, expected_role)
    if connectors is None:
        from afd_core.plugins.registry import get_registry

        connectors = get_registry().connectors
    spec = _parse_connector(values, connectors)
    cls = connector_class(spec)
    host = to_str("host", _value(values, "host"), _HOST_ADVICE)
    port = _parse_int(values, "port")
    timeout_s = _parse_int(values, "afd_process_group_timeout_s")
    topology = _parse_topology(values, spec, cls)
    # Arguments are evaluated in order: the connector's own parser (extra config) runs last.
    config = AFDConfig(
        role=role,
        connector=spec.name,
        host=host,
        port=port,
        num_attention_ranks=topology.num_attention_ranks,
        num_ffn_ranks=topology.num_ffn_ranks,
        async_dp=to_bool("async_dp", _value(values, "async_dp")),
        afd_process_group_timeout_s=timeout_s,
        compute_gate_on_attention=to_bool(
            "compute_gate_on_attention", _value(values, "compute_gate_on_attention")
        ),
        role_rank=_parse_role_rank(values, role, topology),
        ffn_cuda_graphs=_parse_int(values, "ffn_cuda_graphs"),
        ffn_idle_limit_s=_parse_int(values, "ffn_idle_limit_s"),
        num_stages=_parse_int(values, "num_stages"),
        stage_decode_token_threshold=_parse_int(values, "stage_decode_token_threshold"),
        stage_prefill_token_threshold=_parse_int(values, "stage_prefill_token_threshold"),
        stage_streams=_parse_stage_streams(values),
        connector_extra_config=MappingProxyType(_parse_extra_config(values, spec, cls)),
        expert_placement=cls.pattern_type.expert_placement,
    )
    config = _with_fixed_stages(config, values, cls)
    check_connector(config, cls, registered=connectors)
    return config


def connector_class(spec: ConnectorSpec) -> type[Connector]:
    """Import ``spec``'s connector class.

    Raises AFDInstallError when it cannot be imported, or when it is not a
    :class:`~afd_core.connector.Connector` subclass naming a
    :class:`~afd_core.assembly.Pattern` subclass as its ``pattern_type`` (a plugin bug).
    """
    from afd_core.assembly import Pattern

    cls = spec.load()
    if not (isinstance(cls, type) and issubclass(cls, Connector)):
        raise AFDInstallError(
            f"AFD: connector {spec.name!r} loads {spec.target!r}, which is not a subclass "
            "of afd_core.connector.Connector; fix the plugin that registers it"
        )
    pattern = getattr(cls, "pattern_type", None)
    if not (isinstance(pattern, type) and issubclass(pattern, Pattern)):
        raise AFDInstallError(
            f"AFD: connector class {spec.target!r} sets no pattern_type (the "
            "afd_core.assembly.Pattern subclass its recipe names); fix the plugin that "
            "registers it"
        )
    return cls


_FIELDS = {f.name: f for f in fields(AFDConfig)}

_HOST_ADVICE = "set it to the address of FFN rank 0's node, e.g. 127.0.0.1"

#: The integer keys: (minimum, maximum or None, what to do when the value is outside).
_INT_RULES: Mapping[str, tuple[int, int | None, str]] = MappingProxyType(
    {
        "port": (1, 65535, "pick a free TCP port in that range"),
        "afd_process_group_timeout_s": (
            1,
            None,
            "give the seconds to wait for the other role, e.g. 120",
        ),
        "num_attention_ranks": (
            1,
            None,
            "count the attention ranks (data-parallel groups) of the deployment",
        ),
        "num_ffn_ranks": (1, None, "count the FFN ranks (FFN workers) of the deployment"),
        "ffn_cuda_graphs": (
            0,
            None,
            "give the number of step shapes whose CUDA graph an FFN rank keeps (0: none)",
        ),
        "ffn_idle_limit_s": (
            0,
            None,
            "give the seconds an FFN rank waits for new attention ranks after all of its own "
            "left (0: it ends)",
        ),
        "num_stages": (
            1,
            2,
            "use 1 (one stage per step) or 2 (two micro-batch stages that overlap attention "
            "and FFN)",
        ),
        "stage_decode_token_threshold": (
            MIN_TOKEN_THRESHOLD,
            None,
            "give the fewest tokens a batch of decodes needs to run as two stages",
        ),
        "stage_prefill_token_threshold": (
            MIN_TOKEN_THRESHOLD,
            None,
            "give the fewest tokens a batch with a prefill needs to run as two stages",
        ),
    }
)


def _value(values: Mapping[str, Any], key: str) -> Any:
    """The raw value of ``key``, or its AFDConfig field's default when it is not set."""
    if key in values:
        return values[key]
    default = _FIELDS[key]
    return default.default_factory() if default.default is MISSING else default.default


def _parse_int(values: Mapping[str, Any], key: str) -> int:
    minimum, maximum, advice = _INT_RULES[key]
    if maximum is None:
        return to_int_at_least(key, _value(values, key), minimum, advice)
    return to_int_in_range(key, _value(values, key), minimum, maximum, advice)


def _canonical_keys(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """``raw`` with aliases renamed; unknown keys and alias/key clashes are errors."""
    unknown = [key for key in raw if key not in KEYS and key not in ALIASES]
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        aliases = ", ".join(f"{alias} ({key})" for alias, key in ALIASES.items())
        raise AFDConfigError(
            f"AFD config: unknown key {names} (set to {show(raw[unknown[0]], with_type=False)}); "
            f"valid keys: {', '.join(KEYS)}; aliases: {aliases}; "
            "connector-specific settings go in connector_extra_config"
        )
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in raw.items():
        canonical = ALIASES.get(key, key)
        if canonical in values:
            raise AFDConfigError(
                f"AFD config: {spelled[canonical]!r} (set to "
                f"{show(values[canonical], with_type=False)}) and {key!r} (set to "
                f"{show(value, with_type=False)}) both set {canonical}; keep only {canonical!r}"
            )
        values[canonical] = value
        spelled[canonical] = key
    return values


def _parse_role(values: Mapping[str, Any], expected_role: Role | None) -> Role:
    if "role" not in values:
        raise AFDConfigError(
            'AFD config: role is missing; set "role" to "attention" (the deployment that '
            'serves requests) or "ffn" (the deployment that holds the MoE/MLP weights)'
        )
    role = values["role"]
    if not (isinstance(role, str) and role in ROLES):
        raise AFDConfigError(
            f'AFD config: role must be "attention" or "ffn", got {show(role)}; '
            "set it to one of the two"
        )
    if expected_role is not None and role != expected_role:
        raise AFDConfigError(
            f"AFD role mismatch: this worker runs the {expected_role} role but "
            f'additional_config["afd"]["role"] is "{role}"; give each deployment the config '
            f'of the role it runs ("role": "{expected_role}" here)'
        )
    return cast("Role", role)


def _parse_connector(
    values: Mapping[str, Any], connectors: Mapping[str, ConnectorSpec]
) -> ConnectorSpec:
    registered = ", ".join(sorted(connectors)) or "(none: install afd-core's plugins)"
    if "connector" not in values:
        raise AFDConfigError(
            f'AFD config: connector is missing; set "connector" to one of the registered '
            f"connectors: {registered}"
        )
    name = values["connector"]
    if not isinstance(name, str) or name not in connectors:
        raise AFDConfigError(
            f"AFD config: connector {show(name)} is not registered; registered connectors: "
            f"{registered}; fix the name or install the plugin package that provides it"
        )
    return connectors[name]


def _parse_topology(
    values: Mapping[str, Any], spec: ConnectorSpec, cls: type[Connector]
) -> Topology:
    num_attention_ranks = _parse_int(values, "num_attention_ranks")
    num_ffn_ranks = _parse_int(values, "num_ffn_ranks")
    try:
        return Topology(num_attention_ranks, num_ffn_ranks, cls.pattern_type.pairing())
    except AFDConfigError as exc:
        reason = str(exc).removeprefix("AFD topology: ")
        reason = reason.replace("(the connector pairs", f"({spec.name} pairs")
        raise AFDConfigError(f"AFD config: {reason}") from exc


def _parse_stage_streams(values: Mapping[str, Any]) -> StageStreams:
    value = _value(values, "stage_streams")
    if value not in STAGE_STREAMS:
        choices = " or ".join(repr(choice) for choice in STAGE_STREAMS)
        raise AFDConfigError(
            f"AFD config: stage_streams must be {choices}, got {show(value)}; use "
            '"per-stage" (each stage of a two-stage step on its own CUDA stream) or "shared"'
        )
    return value


def _parse_role_rank(values: Mapping[str, Any], role: Role, topology: Topology) -> int | None:
    value = _value(values, "role_rank")
    if value is None:
        return None
    count = topology.num_ranks(role)
    count_key = "num_attention_ranks" if role == "attention" else "num_ffn_ranks"
    return to_int_in_range(
        "role_rank",
        value,
        0,
        count - 1,
        f"the {role} role has {count} rank(s) ({count_key}={count}); "
        f"fix role_rank or raise {count_key}",
    )


def _with_fixed_stages(
    config: AFDConfig, values: Mapping[str, Any], cls: type[Connector]
) -> AFDConfig:
    """``config`` with the stages per step its connector's extra config fixes
    (``Connector.stages_fixed_by``); AFDConfigError when ``num_stages`` says otherwise."""
    fixed = cls.stages_fixed_by(cls.parse_extra_config(config.connector_extra_config))
    if fixed is None or fixed == config.num_stages:
        return config
    if "num_stages" in values:
        raise AFDConfigError(
            f"AFD config: num_stages is {config.num_stages}, but {config.connector}'s "
            f"connector_extra_config {show(dict(config.connector_extra_config))} runs "
            f"{fixed} stage(s) per step; leave num_stages out or set it to {fixed}"
        )
    return replace(config, num_stages=fixed)


def _parse_extra_config(
    values: Mapping[str, Any], spec: ConnectorSpec, cls: type[Connector]
) -> dict[str, Any]:
    extra = to_mapping(
        "connector_extra_config",
        _value(values, "connector_extra_config"),
        f"put {spec.name}'s own settings in a JSON object ({{}} for none)",
    )
    try:
        cls.parse_extra_config(extra)
    except AFDConfigError:
        raise
    except (TypeError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        raise AFDConfigError(
            f"AFD config: connector_extra_config {show(dict(extra))} was rejected by "
            f"{spec.name}: {reason}; fix it as the connector's documentation says"
        ) from exc
    return copy.deepcopy(dict(extra))
