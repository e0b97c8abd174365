"""The steps of a kernel build of afd-ascend-ops, as commands: one plan, stated once.

When the build switch says compile (:mod:`afd_ascend_ops.build_switch`), the build hook
(``hatch_build.py``) runs :func:`kernel_build_steps` in order, in the CANN image:

1. ``csrc/build_kernels.sh <soc>``: the AscendC custom op package of ``a2e``/``e2a`` for
   the SoC, installed under ``src/afd_ascend_ops/_cann_ops/<soc>/``;
2. CMake configure, build and install of the binding (``afd_ascend_ops._C``) against this
   Python's torch and torch-npu and that package's ``libcust_opapi.so``.

The SoC is ``AFD_ASCEND_SOC`` (default :data:`DEFAULT_SOC`, the one SoC of
``csrc/op_registry.json``). **Never run**: no CANN toolkit was available to this project
(docs/ascend.md); the plan is unit-tested as data. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: The variable that picks the SoC, and its default.
SOC_VARIABLE = "AFD_ASCEND_SOC"
DEFAULT_SOC = "ascend910_93"
#: The custom op vendor build_kernels.sh installs (its op_api library holds aclnnA2e/E2a).
VENDOR = "afd"


@dataclass(frozen=True)
class BuildStep:
    """One command of the plan (run in the package's directory): what it does, for the
    build log, and its argv."""

    what: str
    argv: tuple[str, ...]


def installed_vendor_dir(package: Path, soc: str) -> Path:
    """The custom op package of ``soc`` inside the Python package directory ``package``
    (``.../afd_ascend_ops``): the directory ``ASCEND_CUSTOM_OPP_PATH`` must name at run
    time. ``soc`` may be a glob pattern."""
    return package / "_cann_ops" / soc / "vendors" / VENDOR


def vendor_dir(package_dir: Path, soc: str) -> Path:
    """Where build_kernels.sh installs the custom op package of ``soc``, in the source
    tree at ``package_dir``."""
    return installed_vendor_dir(package_dir / "src" / "afd_ascend_ops", soc)


def kernel_build_steps(
    package_dir: Path, python: str, env: Mapping[str, str]
) -> tuple[BuildStep, ...]:
    """The commands of a kernel build of the package at ``package_dir`` for the
    interpreter ``python`` (whose torch and torch-npu the binding is built against)."""
    soc = env.get(SOC_VARIABLE, "").strip() or DEFAULT_SOC
    csrc = package_dir / "csrc"
    build = package_dir / "build" / "binding"
    opapi = vendor_dir(package_dir, soc) / "op_api" / "lib" / "libcust_opapi.so"
    return (
        BuildStep(
            f"AscendC kernels of a2e/e2a for {soc}",
            ("bash", str(csrc / "build_kernels.sh"), soc),
        ),
        BuildStep(
            "configure the binding afd_ascend_ops._C",
            (
                "cmake",
                "-S",
                str(csrc),
                "-B",
                str(build),
                f"-DPython3_EXECUTABLE={python}",
                f"-DAFD_CUST_OPAPI={opapi}",
            ),
        ),
        BuildStep("build the binding", ("cmake", "--build", str(build))),
        BuildStep(
            "install the binding into the package",
            ("cmake", "--install", str(build), "--prefix", str(package_dir / "src")),
        ),
    )
