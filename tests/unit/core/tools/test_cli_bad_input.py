"""Every ``afd`` subcommand answers a user's mistake with one ``error:`` line on stderr
and exit status 2, before it starts anything: never a traceback (the table of issue #35
item 4). Each case runs ``afd`` in-process through its ``main``."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from afd_core.tools.cli import main as afd_main

P2P = {"role": "ffn", "connector": "P2pGlooAFDConnector"}
EXPERT = {
    "role": "ffn",
    "connector": "ExpertRoutedAFDConnector",
    "num_ffn_ranks": 2,
    "compute_gate_on_attention": True,
}


@pytest.fixture
def inputs(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Paths and a taken port for the table, by name."""
    (tmp_path / "bad.json").write_text("{bad")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "empty-model").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_experts": 16}))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    yield {
        "dir": str(tmp_path),
        "bad": str(tmp_path / "bad.json"),
        "list": str(tmp_path / "list.json"),
        "missing": str(tmp_path / "missing.json"),
        "empty_model": str(tmp_path / "empty-model"),
        "model": str(model),
        "taken_port": str(taken.getsockname()[1]),
    }
    taken.close()


#: (case id, argv with <placeholders> of the ``inputs`` fixture, text the error line holds)
CASES = [
    ("check-missing-file", ["check", "<missing>"], "cannot read"),
    ("check-bad-json", ["check", "<bad>"], "not valid JSON"),
    ("check-not-an-object", ["check", "<list>"], "must be a JSON object"),
    ("check-unknown-connector", ["check", json.dumps({**P2P, "connector": "Nope"})],
     "not registered"),
    ("check-wrong-type", ["check", json.dumps({**P2P, "num_ffn_ranks": "two"})],
     "must be an integer"),
    ("check-model-missing", ["check", "--model", "<dir>/nowhere", json.dumps(P2P)],
     "is not a directory"),
    ("check-model-without-config", ["check", "--model", "<empty_model>", json.dumps(P2P)],
     "has no config.json"),
    ("check-no-experts", ["check", "--num-experts", "0", json.dumps(EXPERT)], "at least 1"),
    ("launch-model-missing", ["launch", "<dir>/nowhere"], "is not a directory"),
    ("launch-model-without-config", ["launch", "<empty_model>"], "has no config.json"),
    ("launch-port-in-use", ["launch", "<model>", "--port", "<taken_port>"], "is in use"),
    ("launch-unknown-connector", ["launch", "<model>", "--connector", "Nope"], "not registered"),
    ("profile-not-a-url", ["profile", "notaurl", "--seconds", "1"], "is not a server URL"),
    ("profile-seconds", ["profile", "http://127.0.0.1:9", "--seconds", "-1"], "must be positive"),
]  # fmt: skip


def fill(arg: str, inputs: dict[str, str]) -> str:
    """``arg`` with each ``<name>`` replaced by ``inputs[name]``."""
    for name, value in inputs.items():
        arg = arg.replace(f"<{name}>", value)
    return arg


@pytest.mark.parametrize(("argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_users_mistake_gets_one_error_line_and_exit_status_2(
    argv: list[str], expected: str, inputs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = afd_main([fill(arg, inputs) for arg in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0] and "Traceback" not in out + err, err


def test_a_model_directory_with_its_config_gives_the_expert_split(inputs, capsys):
    assert afd_main(["check", "--model", inputs["model"], json.dumps(EXPERT)]) == 0
    out = capsys.readouterr().out
    assert "FFN 0 holds experts 0..7" in out and "FFN 1 holds experts 8..15" in out, out
