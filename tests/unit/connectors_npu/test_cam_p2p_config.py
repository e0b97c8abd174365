"""What CAMP2pAFDConnector refuses: the gate on the attention role (its registration,
through config validation), and a ``connector_extra_config`` with unknown keys or a
quantised transfer (building it).

Pure: building the connector imports no torch.
"""

from __future__ import annotations

import sys

import pytest

from afd_connectors_npu.connector import CAMP2pAFDConnector
from afd_connectors_npu.extra_config import CamExtraConfig
from afd_core.config import AFDConfig, parse_afd_config
from afd_core.connector import WireSpec
from afd_core.errors import AFDConfigError

WIRE = WireSpec(hidden_size=16, dtype="bfloat16", num_exchange_layers=2)


def build(role: str = "attention", **extra: object) -> CAMP2pAFDConnector:
    config = AFDConfig(role=role, connector="CAMP2pAFDConnector", connector_extra_config=extra)
    return CAMP2pAFDConnector(config, 0, WIRE)


@pytest.mark.parametrize("role", ["attention", "ffn"])
def test_the_gate_on_the_attention_role_is_refused_naming_the_key(role: str) -> None:
    raw = {"role": role, "connector": "CAMP2pAFDConnector", "compute_gate_on_attention": True}
    with pytest.raises(AFDConfigError, match='set "compute_gate_on_attention": false'):
        parse_afd_config(raw)


def test_unknown_extra_config_keys_are_named_with_the_keys_it_accepts() -> None:
    with pytest.raises(AFDConfigError) as error:
        build(depth=2, quant=1)
    message = str(error.value)
    assert "unknown fields ['depth', 'quant'] for CAMP2pAFDConnector" in message
    assert "it accepts only attn_core_num, core_num, ffn_core_num, quant_mode" in message


@pytest.mark.parametrize("mode", [1, 2])
def test_a_quantised_transfer_is_refused(mode: int) -> None:
    with pytest.raises(
        AFDConfigError, match=rf"quant_mode must be 0 for CAMP2pAFDConnector .*got {mode}"
    ):
        build(quant_mode=mode)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("quant_mode", -1, r"quant_mode \(-1\) must be >= 0"),
        ("core_num", 0, r"core_num \(0\) must be >= 1"),
        ("ffn_core_num", -2, r"ffn_core_num \(-2\) must be >= 0"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_key(key: str, value: int, says: str) -> None:
    with pytest.raises(AFDConfigError, match=says):
        build(**{key: value})


def test_each_role_gets_its_own_cores_or_core_num() -> None:
    extra = build("ffn", core_num=16, attn_core_num=4).extra
    assert extra == CamExtraConfig(core_num=16, attn_core_num=4, ffn_core_num=0, quant_mode=0)
    assert (extra.cores_of("attention"), extra.cores_of("ffn")) == (4, 16)


def test_building_and_closing_an_unused_connector_imports_no_torch() -> None:
    had_torch = "torch" in sys.modules
    conn = build()
    conn.close()
    assert conn.is_closed
    assert ("torch" in sys.modules) == had_torch
