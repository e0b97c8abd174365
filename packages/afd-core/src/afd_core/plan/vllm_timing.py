"""``python -m afd_core.plan.vllm_timing MODEL_DIR OUT_JSON --batches B,.. --contexts C,..
--steps N``: the child process of ``afd measure``; times a model's layers with vLLM's own
kernels on this machine.

It builds an in-process vLLM engine (``vllm.LLM``: no API server, no engine process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; ``VLLM_PLUGINS=""`` so that the AFD plugin stays
out and the stock model classes run), eager (no compilation: a forward hook sees every
layer), prefix caching off. Forward hooks on every decoder layer's ``self_attn`` and
``mlp`` and on the model itself take ``time.perf_counter`` around each call. For each
(batch, context) of the grid it generates ``steps`` tokens for ``batch`` prompts of
``context`` random token ids, and keeps, over the decode steps:

* attention: the median over steps of the mean over layers of ``self_attn``;
* MoE: likewise over the sparse layers' ``mlp`` (gate, shared and routed experts), and
  also the prefill step's, at ``batch x context`` tokens; dense: the dense layers' ``mlp``;
* step overhead: the time from one decode step's model forward to the next one's, less
  the layers' time: embedding, norms, LM head, sampling, scheduling; and that whole
  step (forward to forward), as ``step``.

With ``--served`` it times whole decode steps instead, with vLLM's engine core and worker
in their own processes (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, as a server runs them; all
on the cores this process may use) and this process as the front end: per point, the
wall time of ``generate`` at ``2 + 2 x steps`` output tokens less at 2, over the
``2 x steps`` steps between. ``afd measure`` subtracts the in-process ``step`` from it.

The attention's context is ``context + steps // 2`` (the middle of the decode steps).
Writes the raw samples as JSON; ``afd measure`` turns them into a profile. Imports vLLM
and torch, so only ``afd measure`` runs it, in its own process.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from afd_core.plan.host import cpu_name


def main(argv: list[str] | None = None) -> int:
    """Time the grid and write the samples; exit status 0."""
    parser = argparse.ArgumentParser(prog="python -m afd_core.plan.vllm_timing")
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--contexts", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--served", action="store_true", help="time served decode steps")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    timer = measure_served if args.served else measure
    samples = timer(args.model, batches, contexts, args.steps)
    args.out.write_text(json.dumps(samples, indent=1), encoding="utf-8")
    return 0


def measure(model: Path, batches: list[int], contexts: list[int], steps: int) -> dict[str, Any]:
    """The samples of the module docstring, keyed ``attention``, ``moe``, ``dense``,
    ``step_overhead``, ``step`` (lists of ``[x, ..., seconds]``), with ``threads`` and
    ``method``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_PLUGINS", "")
    import vllm
    from vllm import SamplingParams

    llm = _engine(model, batches, contexts, steps + 1)
    threads = llm.collective_rpc(_install_hooks)[0]
    params = SamplingParams(max_tokens=steps, ignore_eos=True, temperature=0.0)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(0)

    def run(batch: int, context: int) -> list[dict[str, Any]]:
        prompts = [
            {"prompt_token_ids": [rng.randrange(vocab) for _ in range(context)]}
            for _ in range(batch)
        ]
        llm.generate(prompts, params, use_tqdm=False)
        return llm.collective_rpc(_take_records)[0]

    run(min(batches), min(contexts))  # warm-up: first-call allocations and dispatch
    attention: list[list[float]] = []
    overhead: dict[int, list[float]] = defaultdict(list)
    moe: dict[int, list[float]] = defaultdict(list)
    dense: dict[int, list[float]] = defaultdict(list)
    whole: list[list[float]] = []
    for context in contexts:
        for batch in batches:
            forwards = run(batch, context)
            decodes = [f for f in forwards if f["tokens"] == batch][-steps + 1 :]
            prefills = [f for f in forwards if f["tokens"] == batch * context]
            attention.append(
                [batch, context + steps // 2, statistics.median(f["attention"] for f in decodes)]
            )
            for f in decodes + prefills:
                if f["moe"] is not None:
                    moe[f["tokens"]].append(f["moe"])
                if f["dense"] is not None:
                    dense[f["tokens"]].append(f["dense"])
            for f, following in itertools.pairwise(decodes):
                overhead[batch].append(following["start"] - f["start"] - f["layers"])
            starts = [f["start"] for f in decodes]
            gaps = [b - a for a, b in itertools.pairwise(starts)]
            whole.append([batch, context, statistics.median(gaps)])
    return {
        "threads": threads,
        "method": (
            f"vLLM {vllm.__version__} in-process engine on {platform.machine()} "
            f"({cpu_name()}), eager, {threads} torch thread(s); forward hooks on every "
            f"decoder layer; medians over {steps - 1} decode steps per point; "
            f"afd_core.plan.vllm_timing"
        ),
        "attention": attention,
        "moe": [[t, statistics.median(v)] for t, v in sorted(moe.items())],
        "dense": [[t, statistics.median(v)] for t, v in sorted(dense.items())],
        "step_overhead": [
            [b, max(statistics.median(v), 1e-9)] for b, v in sorted(overhead.items())
        ],
        "step": whole,
    }


def measure_served(
    model: Path, batches: list[int], contexts: list[int], steps: int
) -> dict[str, Any]:
    """Served decode steps (see the module docstring): ``served_step`` as a list of
    ``[batch, context, seconds]``, with ``method``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ.setdefault("VLLM_PLUGINS", "")
    import vllm
    from vllm import SamplingParams

    short, long = 2, 2 + 2 * steps
    llm = _engine(model, batches, contexts, long + 1)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(0)

    def wall(prompts: list[dict[str, Any]], tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
        began = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - began

    served: list[list[float]] = []
    wall([{"prompt_token_ids": [1] * min(contexts)}], short)  # warm-up
    for context in contexts:
        for batch in batches:
            prompts = [
                {"prompt_token_ids": [rng.randrange(vocab) for _ in range(context)]}
                for _ in range(batch)
            ]
            extra = wall(prompts, long) - wall(prompts, short)
            served.append([batch, context, max(extra / (long - short), 1e-9)])
    return {
        "method": (
            f"vLLM {vllm.__version__} engine core and worker in their own processes "
            f"({platform.machine()}, {cpu_name()}), eager; generate() wall time at "
            f"{long} less {short} output tokens, per step; afd_core.plan.vllm_timing --served"
        ),
        "served_step": served,
    }


def _engine(model: Path, batches: list[int], contexts: list[int], decode_steps: int) -> Any:
    """vLLM's ``LLM`` sized for the grid: every batch at the longest context."""
    from vllm import LLM

    longest = max(contexts) + decode_steps
    return LLM(
        model=str(model),
        dtype="bfloat16",
        max_model_len=longest,
        max_num_seqs=max(batches),
        max_num_batched_tokens=max(max(batches) * max(contexts), 2048),
        kv_cache_memory_bytes=_kv_bytes(max(batches) * longest),
        enforce_eager=True,
        enable_prefix_caching=False,
        seed=0,
    )


def _kv_bytes(tokens: int) -> int:
    # Generous: 256 KiB a token covers the tiny models and small real ones at this grid.
    return max(64 << 20, tokens * (256 << 10))


def _install_hooks(worker: Any) -> int:
    """Hook every decoder layer of the worker's model; returns torch's thread count."""
    import torch

    model = worker.model_runner.model
    state: dict[str, Any] = {"records": [], "current": None}

    def begin_forward(module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        tokens = int(ids.shape[0]) if ids is not None else 0
        record = {"tokens": tokens, "start": time.perf_counter(), "parts": defaultdict(list)}
        state["records"].append(record)
        state["current"] = record

    def timed(part: str) -> tuple[Any, Any]:
        def before(module: Any, args: Any, kwargs: Any) -> None:
            module._afd_started = time.perf_counter()

        def after(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            if state["current"] is not None:
                state["current"]["parts"][part].append(time.perf_counter() - module._afd_started)

        return before, after

    model.register_forward_pre_hook(begin_forward, with_kwargs=True)
    for layer in model.model.layers:
        parts = {"attention": layer.self_attn}
        parts["moe" if hasattr(layer.mlp, "experts") else "dense"] = layer.mlp
        for part, module in parts.items():
            before, after = timed(part)
            module.register_forward_pre_hook(before, with_kwargs=True)
            module.register_forward_hook(after, with_kwargs=True)
    worker._afd_timing = state
    return torch.get_num_threads()


def _take_records(worker: Any) -> list[dict[str, Any]]:
    """The forwards recorded since the last call, summarised, and forget them."""
    state = worker._afd_timing
    records, state["records"], state["current"] = state["records"], [], None
    out = []
    for r in records:
        parts = r["parts"]
        out.append(
            {
                "tokens": r["tokens"],
                "start": r["start"],
                "layers": sum(sum(v) for v in parts.values()),
                "attention": statistics.fmean(parts["attention"]) if parts["attention"] else 0.0,
                "moe": statistics.fmean(parts["moe"]) if parts["moe"] else None,
                "dense": statistics.fmean(parts["dense"]) if parts["dense"] else None,
            }
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
