"""A profiler timeline of two-stage decode steps on one CUDA GPU: what the GPU runs while
a stage's exchange is in flight, and the hidden share of the exchange.

1. for each ``--streams`` setting (``stage_streams`` ``per-stage`` and ``shared`` by
   default), starts AFD 1A1F of ``--model`` on this host's GPU (both roles on it,
   ``P2pGlooAFDConnector``, the V1 runner, eager, the gpu-harness's engine arguments),
   two stages per step from 2 tokens, the attention server with vLLM's torch profiler;
2. keeps ``--concurrency`` requests decoding and frames one ``afd profile`` window of
   ``--seconds`` over the attention server;
3. reads the attention rank's trace. An *exchange* is one layer of one stage, from the
   start of its ``afd.attention.send`` range to the end of its ``afd.attention.wait``
   range, on that stage's thread (the engine thread's exchanges, of one-stage steps, are
   left out). A kernel belongs to the thread that launched it (its ``correlation`` with
   a CUDA runtime call). The *hidden share* is the time within the exchanges during
   which the GPU ran kernels of the other stage's thread, over the exchanges' total
   time: the part of the round trip that the other stage's attention filled. The stage
   threads' ranges are in the trace because the attention worker profiles every thread
   (:mod:`afd_core.workers.all_threads_profiler`);
4. before the window, sends the tiny models' fixed prompts (greedy, top-5 logprobs) and
   compares the completions of every setting with the first setting's: the stream
   placement must not change a token or a logprob;
5. prints, per setting, the hidden share, the step period and the streams the kernels
   ran on, and a text timeline of one two-stage step from the middle of the window
   (host ranges of both stage threads and, merged into bursts, the kernels of each
   stream); writes that step's trace events to ``--out``/``step-<setting>.json``
   (open it in Perfetto or chrome://tracing) and the text to ``--out``/``timeline.txt``.

The profiler slows the host (every op is recorded): read the shares, not the periods.
Usage::

    python benchmarks/afd_stage_timeline_gpu.py --model DIR [--concurrency 64]
        [--seconds 2] [--out DIR]

Needs vllm (CUDA), openai, afd-core, afd-models, afd-attention, afd-ffn.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from afd_profile_decode import profiler_args, range_base, read_trace

from afd_core.tools.cli import main as afd_main
from afd_core.tools.launch import DeploymentSpec, LocalDeployment

PROMPT = "the attention rank sends hidden states to the expert rank, request"
STREAMS = ("per-stage", "shared")
#: Kernels of one stream closer than this (microseconds) are drawn as one burst.
BURST_GAP_US = 3.0
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Span:
    """One interval of the trace, microseconds."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def main(argv: Sequence[str] | None = None) -> int:
    """Profile each setting, summarise, print and write; 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--streams", nargs="+", choices=STREAMS, default=list(STREAMS))
    parser.add_argument("--out", type=Path, help="where the step traces and text go")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="afd-timeline-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="afd-timeline-work-"))
    texts = []
    completions: dict[str, list[Any]] = {}
    for streams in args.streams:
        traces = work / f"traces-{streams}"
        completions[streams] = _profile(
            args.model, streams, args.concurrency, args.seconds, traces, work
        )
        events = read_trace(traces, "afd-attention0")
        text, step_events = summarise(events, f"stage_streams {streams}, C={args.concurrency}")
        print(text, flush=True)
        texts.append(text)
        (out / f"step-{streams}.json").write_text(json.dumps({"traceEvents": step_events}))
    first, *others = args.streams
    for streams in others:
        line = _compare(completions[first], completions[streams], f"{streams} against {first}")
        print(line)
        texts.append(line)
    (out / "timeline.txt").write_text("\n\n".join(texts) + "\n")
    print(f"written to {out}")
    return 0


def _profile(
    model: Path, streams: str, concurrency: int, seconds: float, traces: Path, work: Path
) -> list[Any]:
    """Start the deployment, take its completions of the fixed prompts, profile a window."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS
    from tests.e2e_cpu.harness import complete
    from tests.e2e_gpu.gpu_settings import server_args

    spec = DeploymentSpec(
        model=model,
        max_num_seqs=concurrency,
        num_stages=2,
        stage_decode_token_threshold=2,
        stage_prefill_token_threshold=2,
        stage_streams=streams,
        start_timeout_s=START_TIMEOUT_S,
        extra_args=server_args(),
        extra_env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
        role_args={"attention": profiler_args(traces)},
    )
    with LocalDeployment(spec, work_dir=work / streams) as deployment:
        completions = complete(deployment.endpoint, PROMPTS, MEASURED_TOKENS)
        _while_decoding(deployment, concurrency, seconds)
    return completions


def _compare(want: list[Any], got: list[Any], label: str) -> str:
    """Whether two settings' completions agree: tokens, and the largest logprob change."""
    tokens = [c.token_ids for c in want] == [c.token_ids for c in got]
    diff = max(
        (
            abs(x[t] - y[t])
            for a, b in zip(want, got, strict=True)
            for x, y in zip(a.top_logprobs, b.top_logprobs, strict=True)
            for t in x.keys() & y.keys()
        ),
        default=0.0,
    )
    return f"completions of {label}: tokens equal {tokens}, max |logprob diff| {diff:.6f} nats"


def _while_decoding(deployment: LocalDeployment, concurrency: int, seconds: float) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{deployment.endpoint}/v1", api_key="x", max_retries=0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def decode() -> None:
        while not stop.is_set():
            try:
                client.completions.create(
                    model=deployment.model_name,
                    prompt=[PROMPT] * concurrency,
                    max_tokens=128,
                    temperature=0.0,
                    extra_body={"ignore_eos": True},
                )
            except BaseException as exc:  # reported after the window
                errors.append(exc)
                return

    load = threading.Thread(target=decode)
    load.start()
    try:
        time.sleep(3.0)
        (attention,) = deployment.attention_servers
        if afd_main(["profile", attention.url, "--seconds", str(seconds)]) != 0:
            raise RuntimeError("afd profile failed")
    finally:
        stop.set()
        load.join()
    if errors:
        raise errors[0]


def _span(event: dict[str, Any]) -> Span:
    return Span(float(event["ts"]), float(event["ts"]) + float(event["dur"]))


def _union_within(spans: Iterable[Span], window: Span) -> float:
    """Microseconds of ``window`` covered by the union of ``spans``."""
    clipped = sorted(
        (max(s.start, window.start), min(s.end, window.end))
        for s in spans
        if s.end > window.start and s.start < window.end
    )
    total, reach = 0.0, window.start
    for start, end in clipped:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _launching_threads(events: list[dict[str, Any]]) -> dict[int, Any]:
    """Each correlation id of a CUDA runtime call: the thread that made it."""
    return {
        e["args"]["correlation"]: e["tid"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }


def exchanges_of(events: list[dict[str, Any]]) -> list[tuple[Any, str, Span]]:
    """(thread, layer name, span) of every exchange: a send and the next wait of its
    layer on the same thread."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if range_base(e["name"]) in ("afd.attention.send", "afd.attention.wait"):
            by_thread[e["tid"]].append(e)
    found = []
    for tid, ranges in by_thread.items():
        ranges.sort(key=lambda e: e["ts"])
        pending: dict[str, dict[str, Any]] = {}
        for e in ranges:
            layer = e["name"].rsplit(".", 1)[-1]
            if range_base(e["name"]) == "afd.attention.send":
                pending[layer] = e
            elif layer in pending:
                send = pending.pop(layer)
                found.append((tid, layer, Span(_span(send).start, _span(e).end)))
    return sorted(found, key=lambda x: x[2].start)


def summarise(events: list[dict[str, Any]], title: str) -> tuple[str, list[dict[str, Any]]]:
    """The summary and the timeline of one step (text), and that step's trace events."""
    launched_by = _launching_threads(events)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernel_threads: dict[Any, list[Span]] = defaultdict(list)
    kernel_streams: dict[Any, set[Any]] = defaultdict(set)
    for k in kernels:
        tid = launched_by.get(k.get("args", {}).get("correlation"))
        kernel_threads[tid].append(_span(k))
        kernel_streams[tid].add(k.get("args", {}).get("stream"))
    engine = {e["tid"] for e in events if range_base(e["name"]) == "afd.attention.begin"}
    exchanges = [x for x in exchanges_of(events) if x[0] not in engine]
    stage_threads = sorted({tid for tid, _, _ in exchanges}, key=str)
    hidden = total = 0.0
    per_exchange = []
    for tid, _, span in exchanges:
        others = [s for t in stage_threads if t != tid for s in kernel_threads.get(t, [])]
        covered = _union_within(others, span)
        hidden += covered
        total += span.length
        per_exchange.append(covered / span.length if span.length else 0.0)
    begins = sorted(
        _span(e).start for e in events if range_base(e["name"]) == "afd.attention.begin"
    )
    periods = [b - a for a, b in itertools.pairwise(begins)]
    lines = [f"== {title}"]
    if not exchanges or total == 0:
        lines.append("  no exchanges in the trace")
        return "\n".join(lines), []
    lines.append(
        f"  {len(exchanges)} exchanges on {len(stage_threads)} threads, {len(periods)} steps; "
        f"step period median {statistics.median(periods) / 1000:.2f} ms (profiled); "
        f"exchange median {statistics.median(s.length for _, _, s in exchanges):.0f} us"
    )
    lines.append(
        f"  hidden share of the exchange (other stage's kernels running): {hidden / total:.0%} "
        f"of {total / 1000:.1f} ms; per exchange median {statistics.median(per_exchange):.0%}"
    )
    for tid in stage_threads:
        lines.append(
            f"  stage thread {tid}: {len(kernel_threads.get(tid, []))} kernels on streams "
            f"{sorted(kernel_streams.get(tid, set()), key=str)}"
        )
    step_lines, step_events = _one_step(events, begins, exchanges, launched_by)
    lines.extend(step_lines)
    return "\n".join(lines), step_events


def _one_step(
    events: list[dict[str, Any]],
    begins: list[float],
    exchanges: list[tuple[Any, str, Span]],
    launched_by: dict[int, Any],
) -> tuple[list[str], list[dict[str, Any]]]:
    """A text timeline of the two-stage step in the middle of the window."""
    two_stage = [
        Span(a, b)
        for a, b in itertools.pairwise(begins)
        if len({tid for tid, _, s in exchanges if a <= s.start < b}) == 2
    ]
    if not two_stage:
        return ["  no two-stage step between two step begins"], []
    step = two_stage[len(two_stage) // 2]
    inside = [e for e in events if step.start <= float(e["ts"]) < step.end]
    stage_of = {}
    for tid, _, span in exchanges:
        if step.start <= span.start < step.end and tid not in stage_of:
            stage_of[tid] = len(stage_of)
    rows: list[tuple[float, str]] = []
    for e in inside:
        if e["name"].startswith("afd.attention.") and e["tid"] in stage_of:
            rows.append((float(e["ts"]), f"stage {stage_of[e['tid']]} {e['name']}"))
    bursts: dict[Any, list[list[float]]] = defaultdict(list)
    for e in sorted((e for e in inside if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        stream = e.get("args", {}).get("stream")
        owner = stage_of.get(launched_by.get(e.get("args", {}).get("correlation")), "?")
        span = _span(e)
        runs = bursts[(stream, owner)]
        if runs and span.start - runs[-1][1] <= BURST_GAP_US:
            runs[-1][1] = max(runs[-1][1], span.end)
            runs[-1][2] += 1
        else:
            runs.append([span.start, span.end, 1])
    for (stream, owner), runs in bursts.items():
        for start, end, count in runs:
            rows.append(
                (
                    start,
                    f"    GPU stream {stream} (stage {owner}): {count} kernels until "
                    f"+{(end - step.start) / 1000:.3f} ms",
                )
            )
    rows.sort()
    lines = [f"  one two-stage step ({step.length / 1000:.2f} ms), from its begin:"]
    lines += [f"  +{(ts - step.start) / 1000:7.3f} ms {text}" for ts, text in rows]
    return lines, inside


if __name__ == "__main__":
    sys.exit(main())
