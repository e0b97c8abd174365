"""afd-ascend-ops' build hook: a pure wheel unless the build switch asks for the Ascend kernels.

The decision is :func:`afd_ascend_ops.build_switch.decide`; the steps of a kernel build are
:func:`afd_ascend_ops.kernel_build.kernel_build_steps` (both loaded from the source tree:
the package is not installed while it is being built). A pure wheel needs nothing more. A
kernel build runs the steps in order (a failing step fails the build, naming it), then
marks the wheel platform-specific and ships the binding and the custom op package.
Never run with the switch on: no CANN toolkit was available to this project
(docs/ascend.md).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HERE = Path(__file__).parent


def source_module(name: str) -> ModuleType:
    """``afd_ascend_ops.<name>``, from the source tree (pure Python, no torch)."""
    path = HERE / "src" / "afd_ascend_ops" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_afd_ascend_ops_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class AscendKernelsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Decides, for the wheel, whether the Ascend kernels are compiled, and compiles them."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        switch = source_module("build_switch")
        decision = switch.decide()
        self.app.display_info(f"afd-ascend-ops: {decision.reason}")
        if not decision.compile:
            return
        plan = source_module("kernel_build")
        for step in plan.kernel_build_steps(HERE, sys.executable, os.environ):
            self.app.display_info(f"afd-ascend-ops: {step.what}: {' '.join(step.argv)}")
            result = subprocess.run(step.argv, cwd=HERE, check=False)
            if result.returncode != 0:
                raise switch.BuildSwitchError(
                    f"afd-ascend-ops: the kernel build failed at '{step.what}' (exit "
                    f"{result.returncode}); see its output above, or build a pure wheel "
                    f"({switch.ENV}=0)"
                )
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].extend(
            ["src/afd_ascend_ops/_C*.so", "src/afd_ascend_ops/_cann_ops/"]
        )
