"""afd-ascend-ops' build hook: a pure wheel unless the build switch asks for the Ascend kernels.

The decision is :func:`afd_ascend_ops.build_switch.decide` (loaded from the source tree:
the package is not installed while it is being built). A pure wheel needs nothing more.
A kernel build is refused for now with a clear error: the AscendC sources of ``a2e`` and
``e2a`` and their binding are not in this source tree yet (see docs/ascend.md).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def build_switch() -> ModuleType:
    """``afd_ascend_ops.build_switch``, from the source tree."""
    path = Path(__file__).parent / "src" / "afd_ascend_ops" / "build_switch.py"
    spec = importlib.util.spec_from_file_location("_afd_ascend_ops_build_switch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class AscendKernelsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Decides, for the wheel, whether the Ascend kernels are compiled."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        switch = build_switch()
        decision = switch.decide()
        self.app.display_info(f"afd-ascend-ops: {decision.reason}")
        if decision.compile:
            raise switch.BuildSwitchError(
                "afd-ascend-ops: the AscendC sources of a2e/e2a and their binding are not in "
                "this source tree yet, so no kernel can be compiled; build a pure wheel "
                f"({switch.ENV}=0)"
            )
