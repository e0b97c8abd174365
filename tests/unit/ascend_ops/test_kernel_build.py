"""The kernel build's plan: the commands the build hook runs when the switch says compile
(data only; nothing of it can run without CANN)."""

from __future__ import annotations

from pathlib import Path

from afd_ascend_ops.kernel_build import DEFAULT_SOC, SOC_VARIABLE, kernel_build_steps, vendor_dir

PACKAGE = Path("/src/afd-ascend-ops")


def test_the_kernels_are_built_before_the_binding_that_links_their_library() -> None:
    kernels, configure, build, install = kernel_build_steps(PACKAGE, "/venv/bin/python", {})
    assert kernels.argv == ("bash", str(PACKAGE / "csrc/build_kernels.sh"), DEFAULT_SOC)
    opapi = vendor_dir(PACKAGE, DEFAULT_SOC) / "op_api/lib/libcust_opapi.so"
    assert f"-DAFD_CUST_OPAPI={opapi}" in configure.argv
    assert "-DPython3_EXECUTABLE=/venv/bin/python" in configure.argv
    assert build.argv[:2] == ("cmake", "--build")
    # The binding lands in the package's source tree, where the wheel's artifacts are.
    assert install.argv[-2:] == ("--prefix", str(PACKAGE / "src"))


def test_the_soc_comes_from_the_environment() -> None:
    kernels, configure, *_ = kernel_build_steps(PACKAGE, "python", {SOC_VARIABLE: " ascend950 "})
    assert kernels.argv[-1] == "ascend950"
    assert any("_cann_ops/ascend950/vendors/afd" in arg for arg in configure.argv)
