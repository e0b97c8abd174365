"""Make the repository root importable, so test helpers resolve as ``tests.<...>`` modules.

Fake connector specs name their classes as ``"tests.unit.core.fake_connectors:..."`` and
are imported through the same loader as real plugins.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
