"""Loading the compiled Ascend kernels: :func:`load_npu_kernels`, with errors that say what
is missing.

The compiled extension ``afd_ascend_ops._C`` (built only when the build switch says so,
:mod:`afd_ascend_ops.build_switch`; sources in ``csrc/``) registers the ``PrivateUse1``
(NPU) kernels of ``a2e`` and ``e2a`` (:data:`COMPILED_OPS`), ops that
:mod:`afd_ascend_ops.ops` defines; the CPU reference kernels need none of it. The CAM
async ops have no compiled kernel in this package. Asked for
where it cannot work (no torch-npu, a pure wheel, an extension that registered nothing),
:func:`load_npu_kernels` raises AFDInstallError naming the missing piece and how to get
it. Hardware-unverified: no Ascend device or CANN toolchain was available to this project,
so the success path has not run; the failure paths are tested with the imports injected.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from afd_ascend_ops.kernel_build import installed_vendor_dir
from afd_ascend_ops.schemas import NAMESPACE, SCHEMAS
from afd_core.errors import AFDInstallError

if TYPE_CHECKING:
    from afd_ascend_ops.reference.provider import OpFamily

#: The compiled extension's module.
EXTENSION = "afd_ascend_ops._C"
#: The dispatch key the compiled kernels register.
NPU_KEY = "PrivateUse1"
#: The ops whose NPU kernels the extension registers.
COMPILED_OPS = ("a2e", "e2a")
#: The ops of each op family (:class:`~afd_ascend_ops.reference.ReferenceOpProvider`).
FAMILY_OPS: dict[str, tuple[str, ...]] = {
    "p2p": COMPILED_OPS,
    "async": tuple(name for name in SCHEMAS if name not in COMPILED_OPS),
}


def load_npu_kernels(
    family: OpFamily = "p2p",
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    import_module: Callable[[str], ModuleType] = importlib.import_module,
    has_kernel: Callable[[str, str], bool] | None = None,
    environ: Mapping[str, str] = os.environ,
    package_dir: Path = Path(__file__).parent,
) -> None:
    """Import torch-npu and the compiled extension, then check that every op of ``family``
    has an NPU kernel. Idempotent. Raises AFDInstallError naming what is missing."""
    ops = FAMILY_OPS[family]
    if not set(ops) <= set(COMPILED_OPS):
        raise AFDInstallError(
            f"afd_ascend: afd-ascend-ops compiles NPU kernels of {' and '.join(COMPILED_OPS)} "
            f"only; {', '.join(ops)} have none in this package, so they run on CPU tensors "
            "(the reference kernels) only: on Ascend use CAMP2pAFDConnector"
        )
    if find_spec("torch_npu") is None:
        raise AFDInstallError(
            "afd_ascend: the compiled Ascend kernels run on NPU tensors, and torch-npu is "
            "not installed; install torch-npu and CANN on an Ascend host, or call the ops "
            "on CPU tensors (the reference kernels)"
        )
    if find_spec(EXTENSION) is None:
        raise AFDInstallError(
            "afd_ascend: this afd-ascend-ops is a pure wheel, built without its Ascend "
            "kernels (AFD_BUILD_ASCEND_OPS unset and no CANN toolchain at build time); "
            "reinstall it in the CANN image: AFD_BUILD_ASCEND_OPS=1 pip install "
            "--no-build-isolation afd-ascend-ops"
        )
    check_custom_opp_path(environ, package_dir)
    import_module("torch_npu")
    import_module("afd_ascend_ops.ops")  # the schemas, before the kernels attach to them
    import_module(EXTENSION)
    check = has_kernel or _has_kernel
    missing = [name for name in ops if not check(f"{NAMESPACE}::{name}", NPU_KEY)]
    if missing:
        raise AFDInstallError(
            f"afd_ascend: {EXTENSION} loaded but registered no {NPU_KEY} kernel for "
            f"{', '.join(missing)}; rebuild afd-ascend-ops against this torch and torch-npu"
        )


def _has_kernel(op: str, key: str) -> bool:
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, key))


def check_custom_opp_path(environ: Mapping[str, str], package_dir: Path) -> None:
    """Raise AFDInstallError unless ``ASCEND_CUSTOM_OPP_PATH`` names the custom op package
    the kernel build installed (``<package>/_cann_ops/<soc>/vendors/afd``): torch-npu finds
    ``aclnnA2e``/``aclnnE2a`` only there, and reads the variable when it is imported."""
    pattern = installed_vendor_dir(Path(), "*")
    vendors = sorted(package_dir.glob(str(pattern)))
    if not vendors:
        raise AFDInstallError(
            f"afd_ascend: {EXTENSION} is installed but the custom op package of a2e/e2a is "
            f"not ({package_dir / '_cann_ops'} is missing); reinstall afd-ascend-ops with "
            "AFD_BUILD_ASCEND_OPS=1 in the CANN image"
        )
    listed = {
        Path(entry) for entry in environ.get("ASCEND_CUSTOM_OPP_PATH", "").split(":") if entry
    }
    if not listed.intersection(vendors):
        raise AFDInstallError(
            "afd_ascend: ASCEND_CUSTOM_OPP_PATH does not name afd-ascend-ops' custom op "
            f"package, so torch-npu cannot find aclnnA2e/aclnnE2a; before starting vLLM: "
            f"export ASCEND_CUSTOM_OPP_PATH={vendors[0]}:$ASCEND_CUSTOM_OPP_PATH"
        )
