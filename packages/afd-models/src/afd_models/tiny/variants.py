"""Build a :class:`~afd_models.tiny.specs.LanguageModelOnlyVariant`: the multimodal
checkpoint around a generated tiny text model's exact weights.

transformers builds the multimodal model from the text model's config and a tiny seeded
vision tower, takes the text model's language weights and ``lm_head`` unchanged and
saves it in the layout released checkpoints have (``model.language_model.*``,
``model.visual.*``, ``lm_head.*``). The tokenizer, generation config and measurement come
from the text model: served with ``--language-model-only`` the variant is that model.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

from afd_models.tiny.generate import TinyModelReport, directory_digest, write_report
from afd_models.tiny.specs import LanguageModelOnlyVariant


def generate_variant(
    variant: LanguageModelOnlyVariant, text: TinyModelReport, out_dir: Path, seed: int
) -> TinyModelReport:
    """Derive ``variant`` from the text model ``text`` built into ``text.path``; save it into
    ``out_dir`` and return its report (the text model's measurement, its own digest).

    Raises ValueError when ``text`` is not the variant's text model.
    """
    import torch
    import transformers

    start = time.perf_counter()
    if text.name != variant.text.name:
        raise ValueError(
            f"tiny variant {variant.name} wraps {variant.text.name}, not {text.name}; build "
            f"{variant.text.name} first"
        )
    text_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(text.path), dtype=torch.bfloat16
    )
    text_config = text_model.config.to_dict()
    text_config.pop("_name_or_path", None)  # where it was read from: not part of the model
    config = getattr(transformers, variant.config_class)(
        text_config=text_config,
        vision_config=dict(variant.vision_config),
        tie_word_embeddings=False,
    )
    config.architectures = [variant.architecture]
    torch.manual_seed(seed)
    model = getattr(transformers, variant.architecture)(config).to(torch.bfloat16)
    model.model.language_model.load_state_dict(text_model.model.state_dict())
    model.lm_head.load_state_dict(text_model.lm_head.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    for source in text.path.iterdir():
        keep = source.name.startswith("tokenizer") or source.name == "generation_config.json"
        if keep and source.is_file():
            shutil.copy(source, out_dir / source.name)
    report = dataclasses.replace(
        text,
        name=variant.name,
        path=out_dir,
        architecture=variant.architecture,
        num_parameters=sum(p.numel() for p in model.parameters()),
        sha256=directory_digest(out_dir),
        seconds=time.perf_counter() - start,
    )
    write_report(report)
    return report
