"""A third-party connector package, installed for real, is found, validated and works.

``tests/plugins/afd-example-connector`` is pip-installed into the running environment
(no network: ``--no-deps --no-build-isolation --no-index``, so hatchling must be
installed), then a fresh interpreter (entry points are read at start-up) reports what AFD
sees. The package has three connectors: ExampleLoopbackConnector (its own ``connect()``,
both roles in one process), ExampleGlooP2pConnector (a recipe of the assembly API) and
ExampleKitPatternConnector (a recipe whose pattern is the package's own, written on
afd-core's pattern kit); the last two run with an attention rank and an FFN rank in two
fresh interpreters over real gloo. The package is uninstalled afterwards. Needs afd-core
installed as a distribution (its own ``afd`` entry point provides P2pGlooAFDConnector)
and torch; no vLLM.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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
out["kit_imported_by_registry"] = "afd_example_connector.kit_block" in sys.modules
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

# One rank of ExampleKitPatternConnector (argv: role, port, scenario), two stages per step:
# - "exact": two steps of two layers; the attention rank sends both stages of a layer before
#   it takes either result; the FFN rank returns ``hidden * 2 + layer + 10 * stage``;
# - "mispaired": the FFN rank sends the result of layer 0 labelled layer 1;
# - "dies": the FFN rank receives layer 0 and exits (status 3) without answering;
# - "close": the attention rank closes its connector (from a thread) while it waits for
#   a result that does not come.
# After a failure scenario the FFN rank waits for its stdin to close.
KIT_RANK = r"""
import dataclasses, json, os, sys, threading
import torch
from afd_core.config import parse_afd_config
from afd_core.connector import WireSpec
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload
from afd_core.plugins.registry import get_registry

role, port, scenario = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = parse_afd_config(
    {"role": role, "connector": "ExampleKitPatternConnector", "port": port, "num_stages": 2,
     "num_attention_ranks": 1, "num_ffn_ranks": 1, "afd_process_group_timeout_s": 30}
)
wire = WireSpec(hidden_size=8, dtype="float32", num_exchange_layers=2)
conn = get_registry().connector(config.connector).load()(config, 0, wire)
conn.initialize()
out = {"pattern": type(conn.recipe().pattern).__name__}
STEPS = ((3, 2), (4, 1))  # rows of stage 0 and stage 1, per step

def error_of(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

def ffn_result(batch):
    return batch.hidden * 2 + (batch.layer + 10 * batch.stage)

def hidden(step, layer, stage):
    rows = STEPS[step][stage]
    return torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8) + 100 * step - layer

def begin(step):
    stages = tuple(AFDDPMetadata(0, (rows,)) for rows in STEPS[step])
    conn.attention.begin_step(ControlPayload(step, 0, stages))

if role == "ffn" and scenario == "exact":
    out["steps"] = []
    for _ in STEPS:
        step = conn.ffn.next_step()
        for layer in range(2):
            for stage in range(2):
                batch = conn.ffn.recv(step, layer, stage)
                conn.ffn.send(batch, ffn_result(batch))
        out["steps"].append([step.payloads[0].step_id, [list(t) for t in step.tokens]])
elif role == "ffn":
    batch = conn.ffn.recv(conn.ffn.next_step(), 0, 0)
    if scenario == "dies":
        print(json.dumps(out), flush=True)
        os._exit(3)
    if scenario == "mispaired":
        relabelled = dataclasses.replace(batch, layer=1)
        out["send"] = error_of(lambda: conn.ffn.send(relabelled, ffn_result(batch)))
    sys.stdin.read()
elif scenario == "exact":
    out["exact"] = []
    for step in range(len(STEPS)):
        begin(step)
        for layer in range(2):
            for stage in range(2):
                conn.attention.send(layer, stage, hidden(step, layer, stage))
            for stage in range(2):
                expected = hidden(step, layer, stage) * 2 + layer + 10 * stage
                out["exact"].append(torch.equal(conn.attention.recv(layer, stage), expected))
else:
    begin(0)
    conn.attention.send(0, 0, hidden(0, 0, 0))
    if scenario == "close":
        threading.Timer(1.0, conn.close).start()
    out["error"] = error_of(lambda: conn.attention.recv(0, 0))
    out["error_again"] = error_of(lambda: conn.attention.recv(0, 0))
conn.close()
print(json.dumps(out))
"""


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


def run_two_ranks(connector: str, script: str, *args: str) -> dict[str, dict[str, Any]]:
    """What each rank of ``script`` (argv: role, port, ``args``) reports, running
    ``connector``: an FFN rank and an
    attention rank, each in a fresh interpreter, at most 120 s in all; both are killed if
    they run past it. The FFN rank's stdin closes once the attention rank is done (a rank
    may wait for that). Each report gains the rank's ``returncode`` (and ``stderr``
    unless it is 0)."""
    (port,) = free_ports(1)
    procs: dict[str, subprocess.Popen[str]] = {}
    deadline = time.monotonic() + 120
    try:
        for role in ("ffn", "attention"):
            procs[role] = subprocess.Popen(
                [sys.executable, "-c", script, role, str(port), *args], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plugin_env(),
            )  # fmt: skip
        results = {}
        for role in ("attention", "ffn"):
            proc = procs[role]
            try:
                stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the {role} rank of {connector} still ran after 120 s")
            lines = stdout.strip().splitlines()
            results[role] = json.loads(lines[-1]) if lines else {}
            results[role]["returncode"] = proc.returncode
            if proc.returncode != 0:
                results[role]["stderr"] = stderr[-4000:]
        return results
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def assert_exited_cleanly(ranks: dict[str, dict[str, Any]], *roles: str) -> None:
    """Each rank of ``roles`` in ``ranks`` (a :func:`run_two_ranks` report) exited with 0."""
    for role in roles:
        assert ranks[role]["returncode"] == 0, f"{role} rank: {ranks[role].get('stderr')}"


@pytest.fixture(scope="module")
def round_trip(example_installed: None) -> dict[str, dict[str, Any]]:
    """What each rank of RANK reports (ExampleGlooP2pConnector)."""
    results = run_two_ranks("ExampleGlooP2pConnector", RANK)
    assert_exited_cleanly(results, "ffn", "attention")
    return results


@pytest.mark.parametrize(
    ("connector", "module_imported"),
    [
        ("ExampleGlooP2pConnector", "recipe_imported_by_registry"),
        ("ExampleKitPatternConnector", "kit_imported_by_registry"),
    ],
)
def test_recipe_connector_is_registered_and_its_module_not_imported(
    seen: dict[str, Any], connector: str, module_imported: str
) -> None:
    assert connector in seen["connectors"]
    assert seen[module_imported] is False


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


@pytest.fixture(scope="module")
def kit_run(example_installed: None) -> Callable[[str], dict[str, dict[str, Any]]]:
    """The reports of both ranks of KIT_RANK in a scenario (each scenario runs once)."""
    runs: dict[str, dict[str, dict[str, Any]]] = {}

    def run(scenario: str) -> dict[str, dict[str, Any]]:
        if scenario not in runs:
            runs[scenario] = run_two_ranks("ExampleKitPatternConnector", KIT_RANK, scenario)
        return runs[scenario]

    return run


def test_kit_pattern_exchanges_two_stages_exactly_between_two_processes(
    kit_run: Callable[[str], dict[str, dict[str, Any]]],
) -> None:
    ranks = kit_run("exact")
    assert_exited_cleanly(ranks, "ffn", "attention")
    assert ranks["attention"]["pattern"] == ranks["ffn"]["pattern"] == "KitBlock"
    # 2 steps x 2 layers x 2 stages, each result exactly hidden * 2 + layer + 10 * stage.
    assert ranks["attention"]["exact"] == [True] * 8
    assert ranks["ffn"]["steps"] == [[0, [[3, 2]]], [1, [[4, 1]]]]


def test_kit_pattern_refuses_a_mispaired_result_naming_both_views(
    kit_run: Callable[[str], dict[str, dict[str, Any]]],
) -> None:
    ranks = kit_run("mispaired")
    assert_exited_cleanly(ranks, "attention")
    attention = ranks["attention"]
    assert attention["error"].startswith(
        "AFDProtocolError: afd_example::f2a on group 'stage 0': the message FFN rank 0 "
        "(world rank 0) sent differs from what attention rank 0 (world rank 1) expects: "
        "layer: sent 1, expected 0. The roles' exchanges are mispaired"
    )
    # The connector failed: every later call raises that error again.
    assert attention["error_again"].startswith("AFDProtocolError: afd_example::f2a")
    assert "failed earlier; close it and start again" in attention["error_again"]


def test_kit_pattern_names_the_ffn_rank_that_died_while_a_result_was_awaited(
    kit_run: Callable[[str], dict[str, dict[str, Any]]],
) -> None:
    ranks = kit_run("dies")
    assert ranks["ffn"]["returncode"] == 3
    assert_exited_cleanly(ranks, "attention")
    attention = ranks["attention"]
    assert attention["error"].startswith("AFDPeerError: "), attention["error"]
    assert "FFN rank 0 (world rank 0)" in attention["error"]
    assert "the result of layer 0 of step 0" in attention["error"]


def test_kit_pattern_wait_ends_with_afd_shutdown_when_the_connector_closes(
    kit_run: Callable[[str], dict[str, dict[str, Any]]],
) -> None:
    ranks = kit_run("close")
    assert_exited_cleanly(ranks, "ffn", "attention")
    assert ranks["attention"]["error"].startswith("AFDShutdown: "), ranks["attention"]["error"]
    assert ranks["attention"]["error_again"].startswith("AFDShutdown: ")


def test_the_example_package_imports_only_afd_cores_public_contract() -> None:
    imported = set()
    for source in (EXAMPLE / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("afd_core"):
                imported.update(f"{node.module}:{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(f"{a.name}:" for a in node.names if a.name.startswith("afd_core"))
    assert "afd_core.assembly:P2P_BLOCK" in imported
    assert "afd_core.kit.channel:MessageChannel" in imported
    private = sorted(n for n in imported if n.partition(":")[2].startswith("_"))
    internal = sorted(n for n in imported if n.startswith(("afd_core.runtime", "afd_core.workers")))
    assert private == [] and internal == []
