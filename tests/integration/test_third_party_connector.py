"""A third-party connector package, installed for real, is found, validated and works.

``tests/plugins/afd-example-connector`` is pip-installed into the running environment
(no network: ``--no-deps --no-build-isolation --no-index``, so hatchling must be
installed), then a fresh interpreter (entry points are read at start-up) reports what AFD
sees. The package is uninstalled afterwards. Needs afd-core installed as a distribution
(its own ``afd`` entry point provides P2pGlooAFDConnector) and torch; no vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "plugins" / "afd-example-connector"
DIST = "afd-example-connector"

CHILD = r"""
import json, sys
import torch
from afd_core.config import parse_afd_config
from afd_core.connector import Connector, WireSpec
from afd_core.errors import AFDConfigError
from afd_core.metadata import AFDDPMetadata, ControlPayload
from afd_core.plugins import get_plugin_manager
from afd_core.registry import get_registry

def error_of(fn):
    try:
        fn()
    except AFDConfigError as exc:
        return str(exc)
    return None

def config(role, extra):
    return parse_afd_config(
        {"role": role, "connector": "ExampleLoopbackConnector", "port": 29999,
         "connector_extra_config": extra}
    )

out = {}
registry = get_registry()
out["connectors"] = sorted(registry.connectors)
out["origin"] = get_plugin_manager().describe("afd_example_connector")
out["imported_by_registry"] = "afd_example_connector.connector" in sys.modules
attention = config("attention", {"loopback_delay_ms": 0})
out["parsed"] = [attention.connector, dict(attention.connector_extra_config)]
out["bad_extra"] = error_of(lambda: config("attention", {"loopback_delay_ms": 0, "bogus": 1}))
out["unknown_in_config"] = error_of(
    lambda: parse_afd_config({"role": "attention", "connector": "NoSuchConnector"})
)
out["unknown_in_registry"] = error_of(lambda: registry.connector("NoSuchConnector"))

cls = registry.connector("ExampleLoopbackConnector").load()
out["class"] = [cls.__module__, cls.__name__, issubclass(cls, Connector)]
wire = WireSpec(hidden_size=4, dtype="float32", num_exchange_layers=1)
attn = cls(attention, 0, wire)
ffn = cls(config("ffn", {}), 0, wire)
module = sys.modules[cls.__module__]
out["resources_after_construction"] = [len(module._channels), attn.is_initialized]

attn.initialize()
ffn.initialize()
hidden = torch.arange(12, dtype=torch.float32).reshape(3, 4)
payload = ControlPayload(step_id=7, sender_rank=0, stages=(AFDDPMetadata(0, (3,)),))
attn.attention.begin_step(payload)
attn.attention.send(0, 0, hidden)
step = ffn.ffn.next_step()
batch = ffn.ffn.recv(step, layer=0, stage=0)
ffn.ffn.send(batch, batch.hidden * 2)
result = attn.attention.recv(0, 0)
out["round_trip_ok"] = bool(torch.equal(result, hidden * 2))
out["step"] = [step.attention_ranks, step.tokens]
# A mispaired layer: the FFN side checks the header it receives.
attn.attention.send(1, 0, hidden)
try:
    ffn.ffn.recv(step, layer=0, stage=0)
    out["mispaired"] = None
except Exception as exc:
    out["mispaired"] = f"{type(exc).__name__}: {exc}"
ffn.close()
try:
    out["next_step_after_close"] = ffn.ffn.next_step()
except Exception as exc:
    out["next_step_after_close"] = type(exc).__name__
attn.close()
out["channels_after_close"] = len(module._channels)
print(json.dumps(out))
"""


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, timeout=300)


@pytest.fixture(scope="module")
def example_installed() -> Iterator[None]:
    """Install the example package for the duration of the module, then remove it."""
    if importlib.util.find_spec("hatchling") is None:
        pytest.fail("hatchling is needed to build tests/plugins/afd-example-connector offline")
    pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(EXAMPLE))
    try:
        yield
    finally:
        pip("uninstall", "-y", DIST)


@pytest.fixture(scope="module")
def seen(example_installed: None) -> dict[str, Any]:
    """What a fresh interpreter with the example package installed reports."""
    env = {k: v for k, v in os.environ.items() if k != "AFD_PLUGINS"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_installed_connector_is_registered_beside_the_builtin_one(seen: dict[str, Any]) -> None:
    assert "ExampleLoopbackConnector" in seen["connectors"]
    assert "P2pGlooAFDConnector" in seen["connectors"]
    assert "distribution 'afd-example-connector'" in seen["origin"]


def test_building_the_registry_does_not_import_the_connector_class(seen: dict[str, Any]) -> None:
    assert seen["imported_by_registry"] is False


def test_config_validation_accepts_the_connector_and_its_extra_config(
    seen: dict[str, Any],
) -> None:
    assert seen["parsed"] == ["ExampleLoopbackConnector", {"loopback_delay_ms": 0}]


def test_connector_rejects_unknown_extra_config_fields(seen: dict[str, Any]) -> None:
    assert seen["bad_extra"] is not None
    assert "bogus" in seen["bad_extra"]
    assert "loopback_delay_ms" in seen["bad_extra"]


@pytest.mark.parametrize("where", ["unknown_in_config", "unknown_in_registry"])
def test_unknown_connector_error_lists_the_installed_connectors(
    seen: dict[str, Any], where: str
) -> None:
    message = seen[where]
    assert "NoSuchConnector" in message
    assert "ExampleLoopbackConnector" in message
    assert "P2pGlooAFDConnector" in message


def test_spec_loads_a_connector_subclass_and_construction_creates_no_resources(
    seen: dict[str, Any],
) -> None:
    assert seen["class"] == [
        "afd_example_connector.connector",
        "ExampleLoopbackConnector",
        True,
    ]
    assert seen["resources_after_construction"] == [0, False]


def test_connector_exchanges_one_layer_and_shuts_down_cleanly(seen: dict[str, Any]) -> None:
    assert seen["step"] == [[0], [[3]]]
    assert seen["round_trip_ok"] is True
    assert seen["next_step_after_close"] == "AFDShutdown"


def test_the_connector_checks_every_header_it_receives(seen: dict[str, Any]) -> None:
    assert seen["mispaired"].startswith("AFDProtocolError: AFD data: a a2f message differs")
    assert "layer: received 1, expected 0" in seen["mispaired"]
    assert seen["channels_after_close"] == 0
