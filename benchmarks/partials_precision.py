"""What ``partials_dtype`` does to the expert-routed connectors' agreement with monolithic vLLM.

For each tiny model, starts a plain vLLM server twice (the baseline: two monolithic runs)
and, for each expert-routed connector (``ExpertRoutedAFDConnector`` over gloo,
``CAMAsyncAFDConnector``) and each ``partials_dtype`` (``model``, ``float32``), a 1A2F
deployment; sends every server the same two workloads and compares with the first
monolithic server:

* the prompt batch (4 prompts, 12 greedy tokens): the largest difference of a top-5
  logprob (nats) at positions whose tokens agree, and the completions whose tokens differ;
* 24 concurrent long completions (40-120 tokens each, the prompts repeated), which vLLM
  batches differently from run to run: how many differ anywhere from monolithic.

Usage (about 15 minutes on a 2-core host)::

    python benchmarks/partials_precision.py [--models tiny-qwen3-moe tiny-deepseek-v2]
        [--connectors ExpertRoutedAFDConnector CAMAsyncAFDConnector]

Prints one line per (model, server) and the host's processor.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_host import build_tiny_model, cpu_model, load_average

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)
from afd_models.tiny.specs import PROMPTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e_cpu.harness import Completion, complete

SHORT_TOKENS = 12
LONG_REQUESTS = 24


def long_lengths() -> list[int]:
    """40..120 tokens, spread over the 24 requests."""
    return [40 + (i * 37) % 81 for i in range(LONG_REQUESTS)]


def run_workloads(url: str) -> tuple[list[Completion], list[list[int]]]:
    """The prompt batch, then the concurrent long completions (token ids)."""
    short = complete(url, PROMPTS, SHORT_TOKENS)
    results: list[Any] = [None] * LONG_REQUESTS

    def one(i: int, tokens: int) -> None:
        results[i] = list(complete(url, [PROMPTS[i % len(PROMPTS)]], tokens)[0].token_ids)

    threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(long_lengths())]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return short, results


def compare(
    reference: tuple[list[Completion], list[list[int]]],
    run: tuple[list[Completion], list[list[int]]],
) -> str:
    """The figures of ``run`` against ``reference``."""
    worst, differing = 0.0, 0
    for want, got in zip(reference[0], run[0], strict=True):
        differing += want.token_ids != got.token_ids
        for pos, (a, b) in enumerate(zip(want.token_ids, got.token_ids, strict=True)):
            if a != b:
                break
            common = set(want.top_logprobs[pos]) & set(got.top_logprobs[pos])
            for token in common:
                worst = max(
                    worst, abs(want.top_logprobs[pos][token] - got.top_logprobs[pos][token])
                )
    long_differ = sum(a != b for a, b in zip(reference[1], run[1], strict=True))
    return (
        f"max |d top-5 logprob| {worst:.4f} nats, short completions differing "
        f"{differing}/{len(reference[0])}, long completions differing "
        f"{long_differ}/{LONG_REQUESTS}"
    )


def monolithic(model: Path, work: Path, cache: Path, name: str) -> VllmServer:
    (port,) = free_ports(1)
    spec = ServerSpec(name=name, model=model, port=port, additional_config=None)
    return VllmServer(spec, work, cache)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", nargs="+", default=["tiny-qwen3-moe", "tiny-deepseek-v2"])
    parser.add_argument(
        "--connectors", nargs="+", default=["ExpertRoutedAFDConnector", "CAMAsyncAFDConnector"]
    )
    args = parser.parse_args()
    print(f"host: {cpu_model()}, load {load_average()}")
    with tempfile.TemporaryDirectory(prefix="afd-partials-") as tmp:
        work = Path(tmp)
        cache = work / "vllm-cache"
        for name in args.models:
            model = build_tiny_model(work / "models", name)
            runs = {}
            for label in ("monolithic", "monolithic again"):
                server = monolithic(model, work, cache, f"{name}-{label.replace(' ', '-')}")
                with server:
                    server.wait_healthy(time.monotonic() + 300)
                    runs[label] = run_workloads(server.url)
            for connector in args.connectors:
                for partials in ("model", "float32"):
                    extra: dict[str, Any] = {"partials_dtype": partials}
                    if connector == "ExpertRoutedAFDConnector":
                        extra["transport"] = "gloo"
                    spec = DeploymentSpec(
                        model=model,
                        num_ffn_ranks=2,
                        connector=connector,
                        compute_gate_on_attention=True,
                        async_dp=connector == "CAMAsyncAFDConnector",
                        connector_extra_config=extra,
                    )
                    run_dir = work / f"{name}-{connector}-{partials}"
                    with LocalDeployment(spec, work_dir=run_dir, cache_root=cache) as deployment:
                        runs[f"{connector} 1A2F partials {partials}"] = run_workloads(
                            deployment.endpoint
                        )
            reference = runs.pop("monolithic")
            for label, run in runs.items():
                print(f"{name} {label}: {compare(reference, run)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
