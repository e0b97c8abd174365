"""``connector_extra_config`` of P2pNcclAFDConnector, and what building one needs.

Pure: importing the connector module imports no torch and needs no GPU.
"""

from __future__ import annotations

import sys

import pytest

from afd_connectors_gpu.p2p_nccl import NcclExtraConfig, P2pNcclAFDConnector
from afd_core.config import AFDConfig
from afd_core.connector import WireSpec
from afd_core.errors import AFDConfigError

WIRE = WireSpec(hidden_size=16, dtype="bfloat16", num_exchange_layers=2)


def build(extra: dict[str, object], role: str = "attention") -> P2pNcclAFDConnector:
    config = AFDConfig(role=role, connector="P2pNcclAFDConnector", connector_extra_config=extra)
    return P2pNcclAFDConnector(config, 0, WIRE)


def test_empty_extra_config_uses_a_normal_priority_stream() -> None:
    assert NcclExtraConfig.parse({}) == NcclExtraConfig(high_priority_stream=False)


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("yes", True), ("off", False)])
def test_high_priority_stream_accepts_booleans_and_boolean_words(
    value: object, expected: bool
) -> None:
    assert NcclExtraConfig.parse({"high_priority_stream": value}).high_priority_stream is expected


@pytest.mark.parametrize("value", [1, 0.0, "fast", None])
def test_a_priority_that_is_not_a_boolean_is_rejected(value: object) -> None:
    with pytest.raises(AFDConfigError, match="high_priority_stream must be true or false"):
        NcclExtraConfig.parse({"high_priority_stream": value})


def test_unknown_fields_are_named_and_a_device_field_is_explained() -> None:
    # Both roles share connector_extra_config, so it cannot hold a per-rank device.
    with pytest.raises(AFDConfigError, match=r"\['depth', 'device'\].*current CUDA device"):
        NcclExtraConfig.parse({"device": 1, "depth": 2})


def test_the_connector_parses_its_extra_config_when_built() -> None:
    conn = build({"high_priority_stream": True})
    assert conn.extra == NcclExtraConfig(high_priority_stream=True)
    assert conn.name == "P2pNcclAFDConnector"
    with pytest.raises(AFDConfigError, match="unknown fields"):
        build({"stream": "fast"}, role="ffn")


def test_building_and_closing_an_unused_connector_imports_no_torch() -> None:
    had_torch = "torch" in sys.modules
    conn = build({})
    conn.close()
    assert conn.is_closed
    assert ("torch" in sys.modules) == had_torch


def test_two_stages_per_step_are_carried_over_nccl() -> None:
    # The pairing of the two stages' posts: tests/unit/roles/test_two_stages_ordered_pairs.py.
    assert P2pNcclAFDConnector.capabilities.two_stages
    assert P2pNcclAFDConnector.capabilities.cuda_graphs
