"""Whether building afd-ascend-ops compiles its Ascend kernels: one decision, stated once.

The wheel is pure Python by default (the CPU reference kernels only). It compiles the
Ascend kernels (AscendC ``a2e``/``e2a`` and the ``PrivateUse1`` binding) only:

* when ``AFD_BUILD_ASCEND_OPS`` is ``1``/``true``/``yes``/``on`` (any case); a missing
  toolchain is then an error naming what is missing;
* or when it is unset (or empty) and the CANN toolchain is found: a toolkit directory
  (``ASCEND_TOOLKIT_HOME`` or ``ASCEND_HOME_PATH``) that exists, and the AscendC compiler
  ``bisheng`` and the op project generator ``msopgen`` on ``PATH``.

``0``/``false``/``no``/``off`` never compiles. Any other value is an error naming the
accepted ones. The build hook (``hatch_build.py``) calls :func:`decide`; it is pure
Python with its environment injected, so the decision table is tested without CANN.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The switch.
ENV = "AFD_BUILD_ASCEND_OPS"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
#: Environment variables that may name the CANN toolkit, in the order they are read.
TOOLKIT_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
#: Programs the kernel build runs.
TOOLS = ("bisheng", "msopgen")


class BuildSwitchError(RuntimeError):
    """``AFD_BUILD_ASCEND_OPS`` has a value it does not accept, or asks for a build the
    toolchain cannot do."""


@dataclass(frozen=True)
class Decision:
    """``compile`` the Ascend kernels or not, and why (one line for the build log)."""

    compile: bool
    reason: str


def decide(
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    is_dir: Callable[[str], bool] = lambda path: Path(path).is_dir(),
) -> Decision:
    """The decision for ``env`` (default: ``os.environ``); ``which`` finds a program on
    ``PATH``, ``is_dir`` checks a directory. Raises BuildSwitchError for a value of the
    switch it does not accept, or for ``AFD_BUILD_ASCEND_OPS=1`` without the toolchain."""
    env = os.environ if env is None else env
    raw = env.get(ENV, "").strip()
    value = raw.lower()
    missing = _missing_toolchain(env, which, is_dir)
    if value in _OFF:
        return Decision(False, f"{ENV}={raw}: pure wheel (CPU reference kernels only)")
    if value in _ON:
        if missing:
            raise BuildSwitchError(
                f"{ENV}={raw} asks for the Ascend kernels, but the CANN toolchain is "
                f"incomplete: {'; '.join(missing)}. Build inside a CANN image with its "
                "set_env.sh sourced, or unset the switch for a pure wheel"
            )
        return Decision(True, f"{ENV}={raw}: compiling the Ascend kernels")
    if value:
        raise BuildSwitchError(
            f"{ENV}={raw!r} is not one of {', '.join(_ON + _OFF)} (or unset: compile only "
            "when the CANN toolchain is found)"
        )
    if missing:
        return Decision(False, f"{ENV} unset and no CANN toolchain ({missing[0]}): pure wheel")
    return Decision(True, f"{ENV} unset and the CANN toolchain found: compiling the Ascend kernels")


def _missing_toolchain(
    env: Mapping[str, str], which: Callable[[str], str | None], is_dir: Callable[[str], bool]
) -> list[str]:
    """What of the toolchain is missing, one phrase each (empty: all there)."""
    missing = []
    toolkits = [env[name] for name in TOOLKIT_VARIABLES if env.get(name)]
    if not any(is_dir(path) for path in toolkits):
        named = ", ".join(f"{name}={env[name]!r}" for name in TOOLKIT_VARIABLES if env.get(name))
        missing.append(
            f"no CANN toolkit directory ({named} is not a directory)"
            if named
            else f"no CANN toolkit ({' or '.join(TOOLKIT_VARIABLES)} not set)"
        )
    missing.extend(f"{tool} not on PATH" for tool in TOOLS if which(tool) is None)
    return missing
