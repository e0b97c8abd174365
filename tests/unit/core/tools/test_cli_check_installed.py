"""``afd check`` against the connectors installed in this environment (the real registry):
every registered connector's config is described, expert-routed ones included, with and
without the model's expert count, and never with a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afd_core.plugins.registry import get_registry
from afd_core.tools.cli import main

#: The expert-routed connectors of this repository, with the settings they need.
EXPERT_ROUTED = {
    "ExpertRoutedAFDConnector": {"connector_extra_config": {"transport": "gloo"}},
    "CAMAsyncAFDConnector": {"async_dp": True},
}


def _installed(name: str) -> None:
    if name not in get_registry().connectors:
        pytest.skip(f"{name}'s package is not installed in this environment")


@pytest.mark.parametrize("name", sorted(EXPERT_ROUTED))
@pytest.mark.parametrize("count", ["none", "flag", "model"])
def test_an_expert_routed_config_is_described_with_or_without_the_expert_count(
    name: str, count: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _installed(name)
    settings = {
        "role": "attention",
        "connector": name,
        "num_attention_ranks": 2,
        "num_ffn_ranks": 2,
        "compute_gate_on_attention": True,
        **EXPERT_ROUTED[name],
    }
    args = ["check", json.dumps(settings)]
    if count == "flag":
        args += ["--num-experts", "16"]
    elif count == "model":
        (tmp_path / "config.json").write_text(json.dumps({"num_experts": 16}))
        args += ["--model", str(tmp_path)]
    status = main(args)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.startswith("AFD config is valid (attention role).")
    if count == "none":
        assert "pass --model DIR or --num-experts N" in captured.out
    else:
        assert "  FFN 1 holds experts 8..15 (8 experts)" in captured.out


def test_every_installed_connector_with_a_default_config_is_described_or_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in sorted(get_registry().connectors):
        settings = {"role": "ffn", "connector": name, "num_attention_ranks": 1}
        status = main(["check", json.dumps(settings)])
        captured = capsys.readouterr()
        if status == 0:
            assert captured.out.startswith("AFD config is valid (ffn role)."), name
        else:
            assert status == 2 and captured.err.startswith("error: "), (name, captured.err)
            assert captured.err.count("\n") == 1, captured.err
