"""``afd plan`` on a tiny model's config.json (a preset and a measured profile file), its
JSON output, and one ``error:`` line with exit status 2 for a user's mistake in ``afd
plan`` or ``afd measure`` (before vLLM starts). ``afd`` runs in-process through ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afd_core.errors import AFDConfigError
from afd_core.plan.model_shape import load_model_shape
from afd_core.plan.profile import load_profile, parse_profile, profile_document
from afd_core.tools.cli import main as afd_main
from afd_core.tools.cli.measure import measured_profile as profile_from_samples
from afd_core.tools.cli.measure import serving_overhead
from tests.unit.plan.conftest import measured_profile, tiny_config, write_model


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_model(tmp_path / "tiny-qwen3-moe", tiny_config("tiny-qwen3-moe"))


@pytest.fixture
def measured_file(tmp_path: Path, tiny: Path) -> Path:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(profile_document(measured_profile(load_model_shape(tiny)))))
    return path


def _plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert afd_main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_afd_plan_json_gives_the_split_batch_stages_speed_ratio_and_binding(tiny, capsys):
    doc = _plan_json([str(tiny), "--profile", "cpu-core", "--tpot-ms", "50", "--gpus", "2"], capsys)
    afd, mono = doc["afd"], doc["monolithic"]
    assert afd["feasible"] and mono["feasible"]
    assert afd["deployment"]["attention_ranks"] + afd["deployment"]["ffn_ranks"] == 2
    assert afd["deployment"]["stages"] in (1, 2) and afd["tpot_ms"] <= 50
    assert doc["ratio"] == pytest.approx(
        afd["tokens_per_s_per_device"] / mono["tokens_per_s_per_device"]
    )
    assert doc["binding"] and doc["context"] == 512  # capped by max_position_embeddings


def test_afd_plan_uses_a_measured_profile_and_evaluates_a_fixed_deployment(
    tiny, measured_file, capsys
):
    doc = _plan_json(
        [
            str(tiny),
            "--profile",
            str(measured_file),
            "--tpot-ms",
            "50",
            "--gpus",
            "3",
            "--attention-ranks",
            "2",
            "--batch",
            "8",
            "--stages",
            "1",
            "--layout",
            "p2p",
            "--baseline-gpus",
            "1",
            "--context",
            "128",
        ],
        capsys,
    )
    assert doc["measured"] is True
    assert doc["afd"]["deployment"] == {
        "layout": "p2p",
        "attention_ranks": 2,
        "ffn_ranks": 1,
        "batch": 8,
        "stages": 1,
    }
    assert doc["monolithic"]["deployment"]["devices"] == 1


def test_afd_plan_prints_a_readable_plan(tiny, capsys):
    assert (
        afd_main(["plan", str(tiny), "--profile", "cpu-core", "--tpot-ms", "50", "--gpus", "2"])
        == 0
    )
    out = capsys.readouterr().out
    assert "AFD: 1A1F" in out and "monolithic EP2" in out and "binding:" in out


def test_afd_plan_says_when_no_deployment_meets_the_bound(tiny, capsys):
    doc = _plan_json(
        [str(tiny), "--profile", "cpu-core", "--tpot-ms", "0.01", "--gpus", "2"], capsys
    )
    assert not doc["afd"]["feasible"] and "TPOT exceeded at batch 1" in doc["afd"]["reason"]
    assert not doc["monolithic"]["feasible"] and doc["ratio"] is None


def test_the_measure_samples_become_a_profile_that_plan_accepts(tiny):
    shape = load_model_shape(tiny)
    samples = {
        "threads": 1,
        "method": "test",
        "attention": [[b, c, 1e-4 * b + 1e-7 * c] for b in (1, 2) for c in (35, 163)],
        "moe": [[1, 1e-4], [2, 1.2e-4], [64, 3e-4]],
        "dense": [],
        "step_overhead": [[1, 1e-3], [2, 1.1e-3]],
    }
    profile = profile_from_samples(shape, load_profile("cpu-core"), tiny, samples)
    assert parse_profile(profile_document(profile)) == profile
    assert profile.measured is not None and profile.measured.dense is None
    assert profile.measured.attention.contexts == (35, 163)


def test_the_served_steps_less_the_in_process_steps_become_the_serving_overhead(tiny):
    shape = load_model_shape(tiny)
    samples = {
        "threads": 1,
        "method": "test",
        "attention": [[b, c, 1e-4 * b + 1e-7 * c] for b in (1, 2) for c in (35, 163)],
        "moe": [[1, 1e-4], [2, 1.2e-4], [64, 3e-4]],
        "dense": [],
        "step_overhead": [[1, 1e-3], [2, 1.1e-3]],
        "step": [[1, 32, 5e-3], [1, 160, 6e-3], [2, 32, 5e-3], [2, 160, 6e-3]],
    }
    served = {
        "method": "served test",
        "served_step": [[1, 32, 7e-3], [1, 160, 9e-3], [2, 32, 4e-3], [2, 160, 5e-3]],
    }
    assert serving_overhead(samples, served) == pytest.approx({1: 2.5e-3, 2: 1e-9})
    profile = profile_from_samples(shape, load_profile("cpu-core"), tiny, samples, served)
    assert profile.measured is not None and profile.measured.serving_overhead is not None
    assert profile.measured.serving_overhead(1) == pytest.approx(1.25e-3)  # pooled: 1 > 2
    assert "served test" in profile.measured.method
    assert parse_profile(profile_document(profile)) == profile
    with pytest.raises(AFDConfigError, match="only"):
        serving_overhead(samples, {"served_step": [[4, 32, 1e-3]]})


CASES = [
    ("plan-missing-dir", ["plan", "<dir>/nowhere", "--profile", "h100", "--tpot-ms", "50"],
     "is not a directory"),
    ("plan-no-config", ["plan", "<empty>", "--profile", "h100", "--tpot-ms", "50"],
     "has no config.json"),
    ("plan-unknown-profile", ["plan", "<tiny>", "--profile", "h999", "--tpot-ms", "50"],
     "neither a file nor a preset"),
    ("plan-bad-profile", ["plan", "<tiny>", "--profile", "<bad>", "--tpot-ms", "50"],
     "not valid JSON"),
    ("plan-zero-tpot", ["plan", "<tiny>", "--profile", "h100", "--tpot-ms", "0"],
     "--tpot-ms must be positive"),
    ("plan-long-context", ["plan", "<tiny>", "--profile", "h100", "--tpot-ms", "50",
                           "--context", "100000"], "exceeds the model's max_position"),
    ("plan-ranks", ["plan", "<tiny>", "--profile", "h100", "--tpot-ms", "50", "--gpus", "4",
                    "--attention-ranks", "2", "--ffn-ranks", "1"], "make 3 devices"),
    ("plan-architecture", ["plan", "<llama>", "--profile", "h100", "--tpot-ms", "50"],
     "afd plan models"),
    ("plan-other-model", ["plan", "<deepseek>", "--profile", "<measured>", "--tpot-ms", "50"],
     "measured on another model"),
    ("measure-missing-dir", ["measure", "<dir>/nowhere", "--out", "<dir>/p.json"],
     "is not a directory"),
    ("measure-out-folder", ["measure", "<tiny>", "--out", "<dir>/no/p.json"], "does not exist"),
    ("measure-batches", ["measure", "<tiny>", "--out", "<dir>/p.json", "--batches", "4,2"],
     "increasing order"),
    ("measure-steps", ["measure", "<tiny>", "--out", "<dir>/p.json", "--steps", "2"],
     "at least 3"),
    ("measure-context", ["measure", "<tiny>", "--out", "<dir>/p.json", "--contexts", "600"],
     "exceeds the model's max_position"),
    ("measure-base", ["measure", "<tiny>", "--out", "<dir>/p.json", "--base", "nope"],
     "neither a file nor a preset"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_users_mistake_gets_one_error_line_and_exit_status_2(
    argv, expected, tmp_path, tiny, measured_file, capsys
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text("{bad")
    llama = write_model(tmp_path / "llama", {"architectures": ["LlamaForCausalLM"]})
    deepseek = write_model(tmp_path / "deepseek", tiny_config("tiny-deepseek-v2"))
    names = {
        "dir": tmp_path,
        "empty": tmp_path / "empty",
        "tiny": tiny,
        "bad": tmp_path / "bad.json",
        "llama": llama,
        "deepseek": deepseek,
        "measured": measured_file,
    }
    filled = []
    for arg in argv:
        for name, value in names.items():
            arg = arg.replace(f"<{name}>", str(value))
        filled.append(arg)
    status = afd_main(filled)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0] and "Traceback" not in out + err, err
