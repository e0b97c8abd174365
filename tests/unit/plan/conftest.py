"""Model configs and profiles the plan tests share: the tiny models' own config fields
(from afd_models.tiny.specs, the generator's source of truth) and a measured profile made
of synthetic timings (no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from afd_core.plan.measured import build_tables
from afd_core.plan.model_shape import ModelShape, model_shape_from_config
from afd_core.plan.profile import HardwareProfile, load_profile
from afd_models.tiny.specs import TINY_MODELS

#: The full-size configs of docs/planning.md's published comparisons.
MODELS = Path(__file__).parent / "models"


def tiny_config(name: str) -> dict[str, Any]:
    """The config.json the tiny-model generator writes for ``name``, as a dict."""
    spec = TINY_MODELS[name]
    return {
        "architectures": [spec.architecture],
        "dtype": "bfloat16",
        **spec.hf_config_kwargs(bos_id=0, eos_id=0, pad_id=3),
    }


def write_model(folder: Path, config: dict[str, Any]) -> Path:
    """A model directory holding only ``config.json`` (all afd plan reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def measured_profile(shape: ModelShape, base: str = "cpu-core") -> HardwareProfile:
    """``base`` with synthetic tables of ``shape``: affine in batch, context and tokens."""
    batches, contexts, tokens = (1, 4, 16), (32, 160), (1, 4, 16, 64, 512)
    tables = build_tables(
        model=shape.fingerprint(),
        method="synthetic (tests)",
        threads=1,
        attention={(b, c): 2e-4 + 3e-6 * b + 1e-8 * b * c for b in batches for c in contexts},
        moe={t: 1.5e-4 + 2e-6 * t for t in tokens},
        step_overhead={b: 1e-3 + 1e-5 * b for b in batches},
        dense={t: 1e-4 + 1e-6 * t for t in tokens} if shape.dense_layers else None,
    )
    base_profile = load_profile(base)
    return HardwareProfile("synthetic", "tests", base_profile.device, base_profile.link, tables)


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny_shape(request: pytest.FixtureRequest) -> ModelShape:
    """Each tiny model's shape."""
    return model_shape_from_config(tiny_config(request.param))
