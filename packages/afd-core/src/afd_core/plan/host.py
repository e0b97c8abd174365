"""The host a measurement ran on, for its record."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``'s first ``model name``), else
    ``platform.processor()``, else ``"unknown CPU"``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
