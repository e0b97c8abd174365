"""The AscendC kernels and op_host files compile against the committed CANN stubs, and the
stubs cannot lie about what the real headers reject.

``packages/afd-ascend-ops/tools/check_kernel_syntax.py`` runs ``g++ -fsyntax-only`` on every
op_host and op_kernel source and on the API probes (whose assertions hold for the stubs and
for the real CANN headers alike: csrc/README.md, "Syntax checks"). Here it runs against the
stubs, then on copies of the sources with the mistakes the stubs must catch planted: the
op type of the HCCL tiling passed as the ``HcclCMDType`` enum (the first review finding).
g++ only; about a second a run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from afd_ascend_ops.kernel_build import DEFAULT_SOC

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "packages" / "afd-ascend-ops"
TOOL = PACKAGE / "tools" / "check_kernel_syntax.py"
CSRC = PACKAGE / "csrc"
TILING_HOST = Path("common/op_host/afd_tiling_host.h")
OP_TYPE = "kBuildTarget.hcclOpType"

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the check needs g++")


def check(csrc: Path = CSRC) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(TOOL), "--csrc", str(csrc)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def planted(tmp_path: Path, path: Path, old: str, new: str) -> Path:
    """A copy of csrc/ with ``old`` replaced by ``new`` once in ``path``."""
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    source = (copy / path).read_text()
    assert source.count(old) == 1, f"{path} no longer contains {old!r} once"
    (copy / path).write_text(source.replace(old, new))
    return copy


@needs_gxx
def test_the_kernels_op_host_files_and_api_probes_compile_against_the_stubs() -> None:
    result = check()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK, 10 sources against the stub headers" in result.stdout


@needs_gxx
def test_the_hccl_op_type_as_the_unqualified_enum_of_finding_1_fails(tmp_path: Path) -> None:
    # What afd_tiling_host.h passed before: not declared on the host side, as in CANN.
    csrc = planted(tmp_path, TILING_HOST, OP_TYPE, "HcclCMDType::HCCL_CMD_ALLTOALLV")
    result = check(csrc)
    assert result.returncode == 1
    assert re.search(r"HcclCMDType.{0,4} has not been declared", result.stderr), result.stderr


@needs_gxx
def test_the_hccl_op_type_as_the_qualified_enum_class_fails(tmp_path: Path) -> None:
    # With the enum in sight it still does not convert to Mc2CcTilingConfig's uint32_t.
    copy = planted(tmp_path, TILING_HOST, OP_TYPE, "AscendC::HcclCMDType::HCCL_CMD_ALLTOALLV")
    header = copy / TILING_HOST
    include = '#include "tiling/hccl/hccl_tiling.h"\n'
    header.write_text(
        header.read_text().replace(include, include + '#include "lib/hccl/hccl_common.h"\n')
    )
    result = check(copy)
    assert result.returncode == 1
    assert "no matching function for call to" in result.stderr
    assert "AscendC::HcclCMDType" in result.stderr


@needs_gxx
def test_a_kernel_that_calls_an_api_the_stubs_lack_fails(tmp_path: Path) -> None:
    # Hccl::Init(GM_ADDR, GM tiling) is deprecated in CANN; the stubs declare only InitV2.
    csrc = planted(
        tmp_path, Path("common/op_kernel/afd_exchange.h"), "hccl_.InitV2(context, &data);",
        "hccl_.Init(context, nullptr);",
    )  # fmt: skip
    result = check(csrc)
    assert result.returncode == 1
    assert "has no member named 'Init'" in result.stderr or "no member named" in result.stderr


def tool_module():
    spec = importlib.util.spec_from_file_location("check_kernel_syntax", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_kernel_source_naming_a_compiler_builtin_is_refused_for_the_real_check(
    tmp_path: Path,
) -> None:
    # The real-header check declares bisheng's builtins loosely (tools/ascendc_standins):
    # a call of one would compile whatever its arguments, so our sources may not make one.
    tool = tool_module()
    assert tool.builtins_named_by(CSRC) == []
    barrier = "AscendC::DataSyncBarrier<AscendC::MemDsbT::ALL>();"
    csrc = planted(tmp_path, Path("common/op_kernel/afd_gm_words.h"), barrier, "dsb(DSB_ALL);")
    assert tool.builtins_named_by(csrc) == [
        "common/op_kernel/afd_gm_words.h: DSB_ALL",
        "common/op_kernel/afd_gm_words.h: dsb",
    ]


def test_op_registry_json_builds_exactly_the_socs_of_afd_socs_h() -> None:
    table = json.loads((CSRC / "op_registry.json").read_text())
    registry = sorted(soc for soc in table if not soc.startswith("_"))
    rows = re.findall(
        r'^\s*\{"(\w+)", "\w+", kHcclCmd', (CSRC / "common/afd_socs.h").read_text(), re.M
    )
    assert registry == sorted(rows)
    assert DEFAULT_SOC in rows
