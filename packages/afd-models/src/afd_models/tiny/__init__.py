"""Tiny random MoE checkpoints for the CPU tests: sharp greedy decisions that need the FFN.

``python -m afd_models.tiny OUT_DIR`` builds them. This package imports no torch: the
specs are plain data; ``afd_models.tiny.generate`` does the building.
"""

from __future__ import annotations

from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS, TINY_MODELS, TinyModelSpec

__all__ = ["MEASURED_TOKENS", "PROMPTS", "TINY_MODELS", "TinyModelSpec"]
