"""What the CPU benchmarks share: the host they ran on, and the tiny model they serve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from afd_core.plan.host import cpu_name

MODEL_BUILD_TIMEOUT_S = 300.0


def cpu_model() -> str:
    """The processor's model name, for the record of a run (:func:`afd_core.plan.host.cpu_name`)."""
    return cpu_name()


def load_average() -> str:
    """``os.getloadavg()`` as ``"1-min 5-min 15-min"``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def build_tiny_model(out_dir: Path, name: str) -> Path:
    """Build the tiny model ``name`` under ``out_dir`` (``python -m afd_models.tiny``)."""
    print(f"building {name} in {out_dir}")
    subprocess.run(
        [sys.executable, "-m", "afd_models.tiny", str(out_dir), "--model", name],
        check=True,
        timeout=MODEL_BUILD_TIMEOUT_S,
    )
    return out_dir / name
