"""The ``PrivateUse1`` binding of ``a2e``/``e2a`` is valid C++ against torch's headers and
the headers of the torch-npu wheel (downloaded, unzipped, never installed), and the check
rejects a binding that misuses a torch-npu declaration.

``packages/afd-ascend-ops/tools/check_binding_syntax.py`` runs ``g++ -fsyntax-only`` (the
AscendC kernels need CANN's headers and cannot be checked here; docs/ascend.md). The
torch-npu wheel (about 43 MB) is fetched from PyPI into a per-session cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.npu.modules import ROOT

pytest.importorskip("torch", reason="the check compiles against the installed torch's headers")
if shutil.which("g++") is None:
    pytest.skip(
        "g++ is not installed: the binding's syntax check needs it", allow_module_level=True
    )

PACKAGE = ROOT / "packages" / "afd-ascend-ops"
TOOL = PACKAGE / "tools" / "check_binding_syntax.py"
BINDING = PACKAGE / "csrc" / "binding"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("torch-npu-headers")


def check(cache_dir: Path, *sources: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(TOOL), "--cache-dir", str(cache_dir)]
    command += [arg for source in sources for arg in ("--source", str(source))]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def test_the_binding_compiles_against_torch_and_torch_npu_headers(cache_dir: Path) -> None:
    result = check(cache_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_a_misspelt_acl_declaration_fails_the_check(cache_dir: Path, tmp_path: Path) -> None:
    # A copy of the binding beside a link to the shared headers, so its includes resolve.
    shutil.copytree(BINDING, tmp_path / "binding")
    (tmp_path / "common").symlink_to(PACKAGE / "csrc" / "common")
    registry = tmp_path / "binding" / "group_registry.h"
    source = registry.read_text()
    assert source.count("ACL_HOST_REGISTER_MAPPED") == 1
    registry.write_text(source.replace("ACL_HOST_REGISTER_MAPPED", "ACL_HOST_REGISTER_MAPED"))
    result = check(cache_dir, tmp_path / "binding" / "afd_ascend_npu.cpp")
    assert result.returncode != 0
    assert "ACL_HOST_REGISTER_MAPED" in result.stdout + result.stderr
