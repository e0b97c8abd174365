"""The predictions docs/planning.md compares with published results: each case is the
source's own setting (model, hardware, A:F, batch) as ``afd plan`` arguments, and the
numbers the document reports. A change to the cost model or a preset that moves one of
them fails here: rerun ``afd plan`` with the case's arguments and update the document."""

from __future__ import annotations

import json

import pytest

from afd_core.tools.cli import main as afd_main
from tests.unit.plan.conftest import MODELS

QWEN = str(MODELS / "qwen3-235b-a22b-fp8")
V3 = str(MODELS / "deepseek-v3")
H800 = str(MODELS.parent / "profiles" / "h800-ib.json")
NO_BOUND = ["--tpot-ms", "1000"]

#: (case, afd plan arguments, predicted AFD tok/s per device, monolithic, ratio) as in
#: docs/planning.md; AFD None where only the baseline is checked.
CASES = [
    ("fastafd-8k-7to1", [QWEN, "--profile", "gb200", *NO_BOUND, "--gpus", "32",
     "--attention-ranks", "28", "--ffn-ranks", "4", "--layout", "expert", "--batch", "96",
     "--stages", "2", "--baseline-gpus", "4", "--baseline-batch", "64", "--context", "8192"],
     2725.3, 2070.0, 1.32),
    ("fastafd-16k-11to1", [QWEN, "--profile", "gb200", "--tpot-ms", "50", "--gpus", "48",
     "--attention-ranks", "44", "--ffn-ranks", "4", "--layout", "expert", "--stages", "2",
     "--baseline-gpus", "4", "--context", "16384"], 1530.1, 1092.0, 1.40),
    ("afd-plugin-16k-48a16f", [V3, "--profile", "ascend-910c-die", *NO_BOUND, "--gpus", "64",
     "--attention-ranks", "48", "--ffn-ranks", "16", "--layout", "expert", "--batch", "28",
     "--stages", "2", "--baseline-gpus", "64", "--baseline-batch", "16", "--baseline-stages",
     "2", "--context", "16896"], 277.3, 251.5, 1.10),
    ("afd-plugin-16k-64a16f", [V3, "--profile", "ascend-910c-die", *NO_BOUND, "--gpus", "80",
     "--attention-ranks", "64", "--ffn-ranks", "16", "--layout", "expert", "--batch", "28",
     "--stages", "2", "--baseline-gpus", "64", "--baseline-batch", "16", "--baseline-stages",
     "2", "--context", "16896"], 294.1, 251.5, 1.17),
    ("afd-plugin-32k-48a16f", [V3, "--profile", "ascend-910c-die", *NO_BOUND, "--gpus", "64",
     "--attention-ranks", "48", "--ffn-ranks", "16", "--layout", "expert", "--batch", "14",
     "--stages", "2", "--baseline-gpus", "64", "--baseline-batch", "8", "--baseline-stages",
     "2", "--context", "33280"], 139.8, 126.5, 1.11),
    ("afd-plugin-32k-64a16f", [V3, "--profile", "ascend-910c-die", *NO_BOUND, "--gpus", "80",
     "--attention-ranks", "64", "--ffn-ranks", "16", "--layout", "expert", "--batch", "14",
     "--stages", "2", "--baseline-gpus", "64", "--baseline-batch", "8", "--baseline-stages",
     "2", "--context", "33280"], 148.7, 126.5, 1.18),
    ("xdeepserve-480a288f", [V3, "--profile", "ascend-910c-die", *NO_BOUND, "--gpus", "768",
     "--attention-ranks", "480", "--ffn-ranks", "288", "--layout", "expert", "--batch", "96",
     "--baseline-gpus", "288", "--baseline-batch", "60", "--context", "4096"],
     1153.3, 1243.3, 0.93),
    ("deepseek-ep128-h800", [V3, "--profile", H800, *NO_BOUND, "--gpus", "128",
     "--baseline-batch", "128", "--baseline-stages", "2", "--context", "4096",
     "--ffn-ranks", "32", "--layout", "expert", "--stages", "2"], None, 2956.8, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "afd", "mono", "ratio"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_documented_prediction_of_each_published_setting(argv, afd, mono, ratio, capsys):
    assert afd_main(["plan", *argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["monolithic"]["tokens_per_s_per_device"] == pytest.approx(mono, rel=2e-3)
    if afd is not None:
        assert doc["afd"]["tokens_per_s_per_device"] == pytest.approx(afd, rel=2e-3)
        assert doc["ratio"] == pytest.approx(ratio, abs=0.006)


def _best_ratio(context: int, capsys: pytest.CaptureFixture[str]) -> int:
    """The attention ranks per FFN rank, 3:1 to 17:1 with 4 FFN ranks, with the most
    tokens per second per device (FastAFD's sweep on one GB200 NVL72)."""
    speeds = {}
    for m in range(3, 18, 2):
        argv = [
            QWEN,
            "--profile",
            "gb200",
            "--tpot-ms",
            "50",
            "--gpus",
            str(4 * m + 4),
            "--attention-ranks",
            str(4 * m),
            "--ffn-ranks",
            "4",
            "--layout",
            "expert",
            "--stages",
            "2",
            "--baseline-gpus",
            "4",
            "--context",
            str(context),
            "--json",
        ]
        assert afd_main(["plan", *argv]) == 0
        speeds[m] = json.loads(capsys.readouterr().out)["afd"]["tokens_per_s_per_device"]
    return max(speeds, key=speeds.__getitem__)


def test_the_fastafd_sweep_peaks_at_the_documented_ratios(capsys):
    assert (_best_ratio(8192, capsys), _best_ratio(16384, capsys)) == (7, 11)
