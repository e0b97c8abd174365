"""A third-party connector package, installed for real, is found, validated and works.

``tests/plugins/afd-example-connector`` is pip-installed into the running environment
(no network: ``--no-deps --no-build-isolation --no-index``, so hatchling must be
installed), then a fresh interpreter (entry points are read at start-up) reports what AFD
sees. The package has two connectors: ExampleLoopbackConnector (its own ``connect()``,
both roles in one process) and ExampleGlooP2pConnector (a recipe of the assembly API),
which runs with an attention rank and an FFN rank in two fresh interpreters over real
gloo. The package is uninstalled afterwards. Needs afd-core installed as a distribution
(its own ``afd`` entry point provides P2pGlooAFDConnector) and torch; no vLLM.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.launch import free_ports

EXAMPLE = Path(__file__).resolve().parents[1] / "plugins" / "afd-example-connector"
DIST = "afd-example-connector"

CHILD = r"""
import json, sys
import torch
from afd_core.config import parse_afd_config
from afd_core.connector import Connector, WireSpec
from afd_core.errors import AFDConfigError
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from afd_core.plugins.manager import get_plugin_manager
from afd_core.plugins.registry import get_registry

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
out["recipe_imported_by_registry"] = "afd_example_connector.gloo_p2p" in sys.modules
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

def gloo_p2p(extra):
    return parse_afd_config(
        {"role": "attention", "connector": "ExampleGlooP2pConnector", "port": 29999,
         "connector_extra_config": extra}
    )

counted = gloo_p2p({"count_bytes": "true"})
out["gloo_p2p_bad_value"] = error_of(lambda: gloo_p2p({"count_bytes": 1}))
out["gloo_p2p_unknown_field"] = error_of(lambda: gloo_p2p({"count_bytes": True, "bogus": 1}))
recipe_cls = registry.connector("ExampleGlooP2pConnector").load()
plain, counting = recipe_cls(gloo_p2p({}), 0, wire), recipe_cls(counted, 0, wire)
recipe = counting.recipe()
out["gloo_p2p_recipe"] = [recipe.layout.name, recipe.control.name, recipe.pattern.name,
                          counting.replaces_attention_ranks]
out["gloo_p2p_byte_counts"] = [plain.byte_counts, vars(counting.byte_counts)]
out["gloo_p2p_parsed"] = [counted.connector, vars(plain.extra), vars(counting.extra)]
print(json.dumps(out))
"""

# One rank of ExampleGlooP2pConnector (argv: role, port): two steps of two layers; the FFN
# rank returns ``hidden * 2 + layer``, the attention rank checks every result exactly.
RANK = r"""
import json, sys
import torch
from afd_core.config import parse_afd_config
from afd_core.connector import WireSpec
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from afd_core.plugins.registry import get_registry

role, port = sys.argv[1], int(sys.argv[2])
config = parse_afd_config(
    {"role": role, "connector": "ExampleGlooP2pConnector", "port": port,
     "num_attention_ranks": 1, "num_ffn_ranks": 1, "afd_process_group_timeout_s": 30,
     "connector_extra_config": {"count_bytes": True}}
)
wire = WireSpec(hidden_size=8, dtype="float32", num_exchange_layers=2)
conn = get_registry().connector(config.connector).load()(config, 0, wire)
conn.initialize()
out = {}
if role == "ffn":
    out["steps"] = []
    for _ in range(2):
        step = conn.ffn.next_step()
        for layer in range(2):
            batch = conn.ffn.recv(step, layer, 0)
            conn.ffn.send(batch, batch.hidden * 2 + layer)
        out["steps"].append([step.payloads[0].step_id, [list(t) for t in step.tokens]])
else:
    out["exact"] = []
    for step_id, rows in enumerate((3, 5)):
        stages = (AFDDPMetadata(0, (rows,)),)
        conn.attention.begin_step(ControlPayload(step_id, 0, stages))
        for layer in range(2):
            hidden = torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8) + step_id
            conn.attention.send(layer, 0, hidden)
            out["exact"].append(torch.equal(conn.attention.recv(layer, 0), hidden * 2 + layer))
out["bytes"] = vars(conn.byte_counts)
conn.close()
print(json.dumps(out))
"""
#: Bytes of the hidden states each side sends in RANK: (3 + 5) rows x 8 float32, 2 layers.
RANK_HIDDEN_BYTES = (3 + 5) * 8 * 4 * 2


def plugin_env() -> dict[str, str]:
    """This environment without ``AFD_PLUGINS``: every installed plugin loads."""
    return {k: v for k, v in os.environ.items() if k != "AFD_PLUGINS"}


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
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=plugin_env(), timeout=120
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


@pytest.fixture(scope="module")
def round_trip(example_installed: None) -> dict[str, dict[str, Any]]:
    """What each rank of RANK reports: an FFN rank and an attention rank, each in a fresh
    interpreter, at most 120 s in all; both are killed if they run past it."""
    (port,) = free_ports(1)
    procs: dict[str, subprocess.Popen[str]] = {}
    deadline = time.monotonic() + 120
    try:
        for role in ("ffn", "attention"):
            procs[role] = subprocess.Popen(
                [sys.executable, "-c", RANK, role, str(port)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plugin_env(),
            )  # fmt: skip
        results = {}
        for role, proc in procs.items():
            try:
                stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the {role} rank of ExampleGlooP2pConnector still ran after 120 s")
            assert proc.returncode == 0, f"{role} rank: {stderr}"
            results[role] = json.loads(stdout.strip().splitlines()[-1])
        return results
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_recipe_connector_is_registered_and_its_module_not_imported(
    seen: dict[str, Any],
) -> None:
    assert "ExampleGlooP2pConnector" in seen["connectors"]
    assert seen["recipe_imported_by_registry"] is False


def test_config_validation_accepts_the_recipe_connector_and_parses_count_bytes(
    seen: dict[str, Any],
) -> None:
    assert seen["gloo_p2p_parsed"] == [
        "ExampleGlooP2pConnector",
        {"count_bytes": False},
        {"count_bytes": True},  # written as the string "true"
    ]


def test_recipe_connector_rejects_bad_extra_config(seen: dict[str, Any]) -> None:
    bad_value, unknown = seen["gloo_p2p_bad_value"], seen["gloo_p2p_unknown_field"]
    assert "connector_extra_config.count_bytes must be true or false, got 1 (int)" in bad_value
    assert "['bogus']" in unknown
    assert "count_bytes" in unknown


def test_recipe_connector_is_one_world_with_announced_steps_and_the_p2p_pattern(
    seen: dict[str, Any],
) -> None:
    assert seen["gloo_p2p_recipe"] == ["WORLD", "ANNOUNCED", "P2P block", False]
    assert seen["gloo_p2p_byte_counts"] == [None, {"sent": 0, "received": 0}]


def test_recipe_connector_exchanges_exactly_between_two_processes(
    round_trip: dict[str, dict[str, Any]],
) -> None:
    assert round_trip["attention"]["exact"] == [True, True, True, True]
    assert round_trip["ffn"]["steps"] == [[0, [[3]]], [1, [[5]]]]


def test_recipe_connector_counts_the_bytes_each_side_posted(
    round_trip: dict[str, dict[str, Any]],
) -> None:
    attention, ffn = round_trip["attention"]["bytes"], round_trip["ffn"]["bytes"]
    assert attention["sent"] >= RANK_HIDDEN_BYTES
    assert ffn["sent"] >= RANK_HIDDEN_BYTES
    # Receives are posted at the size of the message they get: both sides agree.
    assert attention["sent"] == ffn["received"]
    assert ffn["sent"] == attention["received"]


def test_the_example_package_imports_only_afd_cores_public_contract() -> None:
    imported = set()
    for source in (EXAMPLE / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("afd_core"):
                imported.update(f"{node.module}:{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(f"{a.name}:" for a in node.names if a.name.startswith("afd_core"))
    assert "afd_core.assembly:P2P_BLOCK" in imported
    private = sorted(n for n in imported if n.partition(":")[2].startswith("_"))
    internal = sorted(n for n in imported if n.startswith(("afd_core.runtime", "afd_core.workers")))
    assert private == [] and internal == []
