"""Build the tiny checkpoints: seeded weights, sharpened, measured, saved as bf16.

Each model directory holds ``config.json``, ``model.safetensors``,
``generation_config.json``, the tokenizer files and ``afd_tiny_model.json`` (the
measurement and the expected fp32 greedy tokens of :data:`~afd_models.tiny.specs.PROMPTS`).
The same seed gives the same bytes; :attr:`TinyModelReport.sha256` covers every file but
the report itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afd_core.errors import AFDError
from afd_models.tiny.measure import Margin, measure
from afd_models.tiny.sharpen import sharpen
from afd_models.tiny.specs import (
    FAMILIES,
    MAX_ATTEMPTS,
    MEASURED_TOKENS,
    PROMPTS,
    TINY_MODELS,
    VARIANTS,
    TinyModelSpec,
)
from afd_models.tiny.tokenizer import build_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast

REPORT_FILE = "afd_tiny_model.json"


class TinyModelError(AFDError):
    """No weight seed gave a model sharp and FFN-dependent enough to test with."""


@dataclass(frozen=True)
class TinyModelReport:
    """What was built where, how sharp it is and the digest of its files.

    ``weight_seed``: the seed of the accepted weights (``seed + attempts - 1``).
    """

    name: str
    path: Path
    architecture: str
    weight_seed: int
    attempts: int
    num_parameters: int
    tokenizer_size: int
    margin: Margin
    sha256: str
    seconds: float

    def summary(self) -> str:
        """One line for people: sizes, margin, FFN dependence, digest."""
        m = self.margin
        return (
            f"{self.name}: {self.num_parameters / 1e6:.2f}M params, "
            f"min gap {m.min_gap_nats:.2f} nats, bf16 shift {m.max_bf16_shift_nats:.3f}, "
            f"ratio {m.margin_ratio:.0f}, FFN zeroed: {m.ffn_changed_tokens} of "
            f"{m.measured_tokens} tokens changed ({m.ffn_token_share:.0%}), "
            f"mean gap shift {m.mean_ffn_shift_nats:.2f} nats, "
            f"{m.distinct_tokens} distinct tokens, seed {self.weight_seed} "
            f"(attempt {self.attempts}), sha256 {self.sha256[:12]}, {self.seconds:.1f}s "
            f"-> {self.path}"
        )


def generate_tiny_models(
    out_root: Path, seed: int = 0, names: Iterable[str] | None = None
) -> list[TinyModelReport]:
    """Build the models ``names`` (of any family, variants included; default: all of
    ``TINY_MODELS``) under ``out_root``.

    Each lands in ``out_root / spec.name``; a variant's text model is built too (first)
    when ``names`` lacks it. Raises KeyError for an unknown name and TinyModelError when
    a model cannot be made sharp and FFN-dependent enough.
    """
    from afd_models.tiny.variants import generate_variant  # imports this module

    known = {name: spec for family in FAMILIES.values() for name, spec in family.items()}
    variants = {name: v for family in VARIANTS.values() for name, v in family.items()}
    wanted = list(names or TINY_MODELS)
    for name in [n for n in wanted if n in variants]:
        if variants[name].text.name not in wanted:
            wanted.insert(0, variants[name].text.name)
    tokenizer = build_tokenizer(seed)
    reports = {
        n: generate_tiny_model(known[n], out_root / n, seed, tokenizer)
        for n in wanted
        if n not in variants
    }
    for name in [n for n in wanted if n in variants]:
        text = reports[variants[name].text.name]
        reports[name] = generate_variant(variants[name], text, out_root / name, seed)
    return [reports[n] for n in wanted]


def generate_tiny_model(
    spec: TinyModelSpec, out_dir: Path, seed: int, tokenizer: PreTrainedTokenizerFast
) -> TinyModelReport:
    """Build, sharpen, measure and save one model into ``out_dir`` (created if needed).

    Tries weight seeds ``seed, seed + 1, ...`` up to ``MAX_ATTEMPTS``; raises
    TinyModelError listing every attempt's shortfalls (:meth:`Margin.shortfalls`) when
    none is sharp and FFN-dependent enough.
    """
    import torch

    start = time.perf_counter()
    spec.check_cpu_constraints(len(tokenizer))
    special = set(tokenizer.all_special_ids)
    regular_ids = [i for i in range(len(tokenizer)) if i not in special]
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    failures = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        weight_seed = seed + attempt - 1
        model = _build(spec, tokenizer, weight_seed)
        sharpen(model, spec, regular_ids, weight_seed)
        # Measure exactly the weights vLLM will load: bf16 values, computed in fp32.
        model.to(torch.bfloat16).to(torch.float32)
        margin = measure(model, prompts, MEASURED_TOKENS)
        if not margin.shortfalls():
            break
        failures.append(f"seed {weight_seed}: " + ", ".join(margin.shortfalls()))
    else:
        raise TinyModelError(
            f"tiny model {spec.name}: no weight seed was sharp and FFN-dependent enough ("
            + "; ".join(failures)
            + "); change embedding_scale / ffn_output_scale / expert_spread in "
            "afd_models.tiny.specs"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    _save(model, tokenizer, out_dir)
    digest = directory_digest(out_dir)
    report = TinyModelReport(
        name=spec.name,
        path=out_dir,
        architecture=spec.architecture,
        weight_seed=weight_seed,
        attempts=attempt,
        num_parameters=sum(p.numel() for p in model.parameters()),
        tokenizer_size=len(tokenizer),
        margin=margin,
        sha256=digest,
        seconds=time.perf_counter() - start,
    )
    write_report(report)
    return report


def read_report(model_dir: Path) -> dict[str, Any]:
    """The ``afd_tiny_model.json`` of a generated model (prompts, expected tokens, margin)."""
    return json.loads((model_dir / REPORT_FILE).read_text())


def _build(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast, seed: int) -> torch.nn.Module:
    import torch
    import transformers

    config_cls = getattr(transformers, spec.config_class)
    model_cls = getattr(transformers, spec.architecture)
    config = config_cls(
        **spec.hf_config_kwargs(
            tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
        )
    )
    torch.manual_seed(seed)
    return model_cls(config).to(torch.float32)


def _save(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    import torch
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # "Writing model shards" for a single small file
    try:
        model.to(torch.bfloat16).save_pretrained(str(out_dir), safe_serialization=True)
    finally:
        if bars:
            logging.enable_progress_bar()
    model.to(torch.float32)
    tokenizer.save_pretrained(str(out_dir))
    generation = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "do_sample": False,
    }
    _write_json(out_dir / "generation_config.json", generation)


def directory_digest(out_dir: Path) -> str:
    """sha256 of every file of a model directory but the report, names included."""
    sha = hashlib.sha256()
    for path in sorted(p for p in out_dir.iterdir() if p.is_file() and p.name != REPORT_FILE):
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def write_report(report: TinyModelReport) -> None:
    """Write ``report`` as ``afd_tiny_model.json`` into its model directory."""
    _write_json(report.path / REPORT_FILE, _report_json(report))


def _report_json(report: TinyModelReport) -> dict[str, Any]:
    margin = asdict(report.margin)
    margin["continuations"] = [list(c) for c in report.margin.continuations]
    return {
        "name": report.name,
        "architecture": report.architecture,
        "weight_seed": report.weight_seed,
        "attempts": report.attempts,
        "num_parameters": report.num_parameters,
        "tokenizer_size": report.tokenizer_size,
        "sha256": report.sha256,
        "prompts": list(PROMPTS),
        "measured_tokens": MEASURED_TOKENS,
        "margin": margin,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
