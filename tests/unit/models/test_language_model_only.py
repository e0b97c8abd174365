"""The start-up rule of multimodal models under AFD: only their language model is split,
so they must be served with ``--language-model-only`` (afd_models.language_model_only).

The roles themselves are built from a real checkpoint in tests/e2e_cpu/test_qwen3_5_moe.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from afd_core.errors import AFDConfigError
from afd_models.language_model_only import require_language_model_only


def _vllm_config(limits: dict[str, int] | None) -> SimpleNamespace:
    mm_config = None
    if limits is not None:
        mm_config = SimpleNamespace(get_limit_per_prompt=lambda modality: limits.get(modality, 999))
    return SimpleNamespace(
        model_config=SimpleNamespace(
            multimodal_config=mm_config, architectures=["Qwen3_5MoeForConditionalGeneration"]
        )
    )


def test_a_multimodal_model_with_its_tower_is_refused_naming_the_flag() -> None:
    with pytest.raises(AFDConfigError, match=r"image, video allowed.*--language-model-only"):
        require_language_model_only(_vllm_config({}))


def test_one_open_modality_is_enough_to_refuse() -> None:
    with pytest.raises(AFDConfigError, match=r"modalities video allowed"):
        require_language_model_only(_vllm_config({"image": 0}))


def test_every_modality_off_or_a_text_model_is_accepted() -> None:
    require_language_model_only(_vllm_config({"image": 0, "video": 0}))
    require_language_model_only(_vllm_config(None))
