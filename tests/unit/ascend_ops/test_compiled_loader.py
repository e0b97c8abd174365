"""What load_npu_kernels says when a piece is missing (imports injected; no NPU here)."""

from __future__ import annotations

import types

import pytest

from afd_ascend_ops.compiled import EXTENSION, load_npu_kernels
from afd_core.errors import AFDInstallError


@pytest.fixture
def installed(tmp_path):
    """A package directory with the custom op package of the kernel build, and the
    environment that names it."""
    vendor = tmp_path / "_cann_ops" / "ascend910_93" / "vendors" / "afd"
    vendor.mkdir(parents=True)
    return {"package_dir": tmp_path, "environ": {"ASCEND_CUSTOM_OPP_PATH": f"/opt/x:{vendor}"}}


def finder(*present: str):
    return lambda name: object() if name in present else None


def importer(name: str) -> types.ModuleType:
    return types.ModuleType(name)


def test_without_torch_npu_it_says_to_install_it_or_use_cpu_tensors() -> None:
    with pytest.raises(AFDInstallError, match=r"torch-npu is not installed; .* on CPU tensors"):
        load_npu_kernels("p2p", finder(EXTENSION), importer)


def test_a_pure_wheel_says_how_to_build_the_kernels() -> None:
    with pytest.raises(
        AFDInstallError, match=r"AFD_BUILD_ASCEND_OPS=1 pip install --no-build-isolation"
    ):
        load_npu_kernels("p2p", finder("torch_npu"), importer)


def test_an_extension_without_npu_kernels_names_the_ops(installed) -> None:
    with pytest.raises(AFDInstallError, match=r"no PrivateUse1 kernel for a2e, e2a; rebuild"):
        load_npu_kernels(
            "p2p", finder("torch_npu", EXTENSION), importer, lambda op, key: False, **installed
        )


def test_with_every_piece_it_loads(installed) -> None:
    load_npu_kernels(
        "p2p", finder("torch_npu", EXTENSION), importer, lambda op, key: True, **installed
    )


def test_without_the_custom_op_package_it_says_to_rebuild(tmp_path) -> None:
    with pytest.raises(AFDInstallError, match=r"custom op package of a2e/e2a is not"):
        load_npu_kernels(
            "p2p", finder("torch_npu", EXTENSION), importer, package_dir=tmp_path, environ={}
        )


def test_an_unset_custom_opp_path_is_named_with_the_export_to_run(installed) -> None:
    vendor = installed["environ"]["ASCEND_CUSTOM_OPP_PATH"].split(":")[1]
    with pytest.raises(
        AFDInstallError, match=rf"export ASCEND_CUSTOM_OPP_PATH={vendor}:\$ASCEND_CUSTOM_OPP_PATH"
    ):
        load_npu_kernels(
            "p2p",
            finder("torch_npu", EXTENSION),
            importer,
            package_dir=installed["package_dir"],
            environ={"ASCEND_CUSTOM_OPP_PATH": "/opt/other"},
        )


def test_the_cam_async_ops_have_no_npu_kernel_here_and_say_what_runs_instead() -> None:
    with pytest.raises(
        AFDInstallError, match=r"compiles NPU kernels of a2e and e2a only; afd_async_dispatch_send"
    ):
        load_npu_kernels("async", finder("torch_npu", EXTENSION), importer, lambda op, key: True)
