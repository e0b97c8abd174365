"""``afd check``: run in-process through ``afd_core.tools.cli.main`` with a fake connector registry.

The registry is replaced by putting a stand-in ``afd_core.plugins.registry`` module into
``sys.modules``, so the command goes through exactly the code path it uses in production
(``parse_afd_config`` asking ``get_registry()`` for the connectors).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from afd_core.errors import AFDInstallError
from afd_core.tools.cli import build_parser, main
from tests.unit.core.fake_connectors import CONNECTORS

VALID = {
    "role": "attention",
    "connector": "FakeP2P",
    "num_attention_ranks": 3,
    "num_ffn_ranks": 2,
    "connector_extra_config": {"depth": 2},
}


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = types.ModuleType("afd_core.plugins.registry")
    registry.get_registry = lambda: SimpleNamespace(connectors=CONNECTORS)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "afd_core.plugins.registry", registry)


def check(capsys: pytest.CaptureFixture[str], argument: str) -> tuple[int, str, str]:
    """Run ``afd check ARGUMENT``; return (exit status, stdout, stderr)."""
    status = main(["check", argument])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_valid_inline_config_prints_every_field_and_the_rank_map(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = check(capsys, json.dumps(VALID))
    assert (status, err) == (0, "")
    assert out.splitlines()[:12] == [
        "AFD config is valid (attention role).",
        '  role: "attention"',
        '  connector: "FakeP2P"',
        '  host: "127.0.0.1"',
        "  port: 29600",
        "  num_attention_ranks: 3",
        "  num_ffn_ranks: 2",
        "  async_dp: false",
        "  afd_process_group_timeout_s: 120",
        "  compute_gate_on_attention: false",
        '  connector_extra_config: {"depth": 2}',
        "  role_rank: null (derived from vLLM's data-parallel rank)",
    ]
    assert "AFD world: 5 ranks (2 FFN first, then 3 attention)" in out
    assert "FFN 0 (world 0) serves: attention 0 (world 2), attention 1 (world 3)" in out
    assert "FFN 1 (world 1) serves: attention 2 (world 4)" in out
    assert "control payloads from attention ranks: 0, 1" in out


def test_the_stage_settings_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = check(capsys, json.dumps(VALID | {"num_stages": 2}))
    assert status == 0
    lines = out.splitlines()
    assert "  num_stages: 2" in lines
    assert "  stage_decode_token_threshold: 32" in lines
    assert "  stage_prefill_token_threshold: 512" in lines


def test_whole_additional_config_with_an_afd_key_is_accepted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = {"afd": VALID | {"role": "ffn"}, "gdn_prefill_backend": "triton"}
    status, out, _ = check(capsys, json.dumps(document))
    assert status == 0
    assert out.startswith("AFD config is valid (ffn role).")


def test_config_file_is_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "afd.json"
    path.write_text(json.dumps({"afd": VALID}), encoding="utf-8")
    status, out, _ = check(capsys, str(path))
    assert status == 0
    assert "  num_ffn_ranks: 2" in out


def test_explicit_role_rank_is_placed_in_the_world(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = check(capsys, json.dumps(VALID | {"role_rank": 2}))
    assert status == 0
    assert "  role_rank: 2" in out
    assert "This process: attention rank 2 (world 4)" in out


def assert_one_line_error(status: int, out: str, err: str, *fragments: str) -> None:
    assert status == 2
    assert out == ""
    assert err.endswith("\n")
    assert err.count("\n") == 1, err
    assert err.startswith("error: ")
    for fragment in fragments:
        assert fragment in err, (fragment, err)


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("bad role", {"role": "atention"}, "role must be"),
    ("missing role", {"role": None}, "role is missing"),
    ("unknown connector", {"connector": "Nope"}, "connector 'Nope'"),
    ("bad port type", {"port": "80a"}, "port must be an integer"),
    ("port range", {"port": 70000}, "port (70000) must be in 1..65535"),
    ("alias clash", {"port": 1, "afd_port": 2}, "'afd_port'"),
    ("unknown key", {"depth": 2}, "unknown key 'depth'"),
    ("async_dp without an async-DP connector", {"async_dp": True}, "async_dp (true)"),
    ("async-DP connector without async_dp", {"connector": "FakeAsync"}, "requires async_dp"),
    ("fewer attention than FFN ranks", {"num_ffn_ranks": 4}, "num_attention_ranks (3)"),
    ("empty host", {"host": " "}, "host must not be empty"),
    ("bad timeout", {"afd_process_group_timeout_s": 0}, "afd_process_group_timeout_s (0)"),
    ("bad bool", {"compute_gate_on_attention": 1}, "compute_gate_on_attention must be"),
    ("extra config not a mapping", {"connector_extra_config": [2]}, "connector_extra_config"),
    ("extra config unknown field", {"connector_extra_config": {"x": 1}}, "['x']"),
    ("role_rank out of range", {"role_rank": 3}, "role_rank (3)"),
]


@pytest.mark.parametrize(
    ("changes", "fragment"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_config_prints_one_line_error_and_exits_2(
    capsys: pytest.CaptureFixture[str], changes: dict[str, Any], fragment: str
) -> None:
    settings = {k: v for k, v in (VALID | changes).items() if v is not None}
    status, out, err = check(capsys, json.dumps(settings))
    assert_one_line_error(status, out, err, "error: AFD config: ", fragment)


def test_afd_value_that_is_not_an_object_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(capsys, json.dumps({"afd": [1, 2]}))
    assert_one_line_error(status, out, err, 'additional_config["afd"] must be a mapping')


def test_uninstalled_connector_package_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(capsys, json.dumps(VALID | {"connector": "FakeUninstalled"}))
    assert_one_line_error(status, out, err, "error: AFD: cannot import", "afd_not_installed")


def test_multi_line_plugin_error_is_printed_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_registry() -> None:
        raise AFDInstallError("AFD: cannot load plugin 'x': Traceback\n  line 2")

    monkeypatch.setattr(sys.modules["afd_core.plugins.registry"], "get_registry", broken_registry)
    status, out, err = check(capsys, json.dumps(VALID))
    assert_one_line_error(status, out, err, "error: AFD: cannot load plugin 'x': Traceback line 2")


def test_invalid_inline_json_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(capsys, '{"role": "ffn",}')
    assert_one_line_error(
        status, out, err, "error: afd check: the CONFIG argument is not valid JSON", "line 1"
    )


def test_invalid_json_file_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "afd.json"
    path.write_text('{"role":\n', encoding="utf-8")
    status, out, err = check(capsys, str(path))
    assert_one_line_error(status, out, err, f"{str(path)!r} is not valid JSON", "line 2")


def test_key_repeated_in_one_json_object_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(
        capsys, '{"afd": {"role": "ffn", "connector": "FakeP2P", "role": "x"}}'
    )
    assert_one_line_error(status, out, err, "afd check: key 'role' appears twice", "'ffn' and 'x'")


def test_missing_file_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.json")
    status, out, err = check(capsys, missing)
    assert_one_line_error(
        status, out, err, f"afd check: cannot read {missing!r}", "No such file", "JSON object"
    )


@pytest.mark.parametrize("document", ["[1, 2]", '"ffn"', "3"])
def test_json_that_is_not_an_object_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: str
) -> None:
    path = tmp_path / "afd.json"
    path.write_text(document, encoding="utf-8")
    status, out, err = check(capsys, str(path))
    assert_one_line_error(status, out, err, "afd check: the config must be a JSON object")


def test_inline_json_array_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(capsys, " [1, 2]")
    assert_one_line_error(status, out, err, "the config must be a JSON object, got list")


def test_check_is_registered_as_a_subcommand() -> None:
    parser = build_parser()
    args = parser.parse_args(["check", "{}"])
    assert args.command == "check"
    assert args.config == "{}"


def test_missing_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_check_help_names_the_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["check", "--help"])
    assert info.value.code == 0
    assert "CONFIG_JSON_OR_FILE" in capsys.readouterr().out


EXPERT = {
    "role": "ffn",
    "connector": "FakeExpert",
    "compute_gate_on_attention": True,
    "num_attention_ranks": 1,
    "num_ffn_ranks": 3,
}


def test_an_expert_routed_config_prints_which_ffn_rank_holds_which_experts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"n_routed_experts": 8}))
    status = main(["check", json.dumps(EXPERT), "--model", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0
    assert '  expert_placement: "balanced"' in out
    assert out.splitlines()[-4:] == [
        "routed experts: 8 over 3 FFN rank(s) (balanced blocks)",
        "  FFN 0 holds experts 0..2 (3 experts)",
        "  FFN 1 holds experts 3..5 (3 experts)",
        "  FFN 2 holds experts 6..7 (2 experts)",
    ]


def test_without_an_expert_count_the_check_says_how_to_get_the_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = check(capsys, json.dumps(EXPERT))
    assert status == 0
    assert "pass --model DIR or --num-experts N" in out.splitlines()[-1]


def test_too_many_ffn_ranks_for_the_experts_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["check", json.dumps(EXPERT), "--num-experts", "2"])
    assert status == 2
    assert "2 routed experts cannot be split over num_ffn_ranks=3" in capsys.readouterr().err
