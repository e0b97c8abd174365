"""Decode time per step of AFD 1A1F against monolithic vLLM on CUDA, eager and graphs.

A random Qwen3-MoE of realistic width (hidden 2048, 8 layers, 64 experts, top-8, expert
width 768; the tiny model's tokenizer, ``--load-format dummy`` weights) is served four
ways at once, all launched together:

* monolithic vLLM on GPU 0, eager and ``FULL_DECODE_ONLY`` graphs;
* AFD 1A1F over ``P2pNcclAFDConnector``, attention on GPU 0 and FFN on GPU 1, eager and
  graphs (both roles of a deployment run the same mode).

For every batch size B, each server first gets one untimed request of that size; then
``--repeats`` streaming requests of B prompts x ``--max-tokens`` tokens (EOS ignored) go
to each server in turn; a request's decode time per step is
(last token - first token of the batch) / (max_tokens - 1): every step emits one token
per sequence, so this is the time of one decode step of B sequences. Prints one table:
medians per server, and the AFD/monolithic ratio per mode.

Run from the repository root on a host with two GPUs (the lent H200 machines: through
the gpu-harness, whose engine settings come from ``$GPU_HARNESS_SETTINGS``)::

    python benchmarks/afd_decode_gpu.py --tiny-model DIR [--repeats 5] [--max-tokens 32]

``--connector``, ``--modes``, ``--batches`` and ``--sizes`` (JSON merged over the wide
sizes) exist for a dry run of the script itself on a CPU host (gloo, eager, tiny sizes).

``DIR``: a tiny Qwen3-MoE from ``python -m afd_models.tiny`` (only its tokenizer and
config are used). On the harness, both sides run its stand-in MoE ops, so absolute
times are not vLLM's; the ratio compares like with like.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from afd_decode import per_token_ms

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e_gpu.gpu_settings import server_args

BATCHES = (1, 8, 64, 256)
WIDE = {
    "hidden_size": 2048,
    "num_hidden_layers": 8,
    "num_experts": 64,
    "num_local_experts": 64,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "intermediate_size": 6144,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "mlp_only_layers": [],
    "decoder_sparse_step": 1,
}
SERVING_ARGS = (
    "--load-format",
    "dummy",
    "--max-num-seqs",
    str(max(BATCHES)),
    "--kv-cache-memory-bytes",
    str(1 << 30),
)
START_TIMEOUT_S = 300.0


def wide_model(tiny: Path, out_dir: Path, sizes: dict[str, object]) -> Path:
    """A config-only copy of ``tiny`` at ``sizes`` (weights: dummy)."""
    model = out_dir / "wide-qwen3-moe"
    model.mkdir(parents=True, exist_ok=True)
    for path in tiny.iterdir():
        if path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copy(path, model / path.name)
    config = json.loads((tiny / "config.json").read_text()) | sizes
    (model / "config.json").write_text(json.dumps(config, indent=2))
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny-model", type=Path, required=True, help="tiny-qwen3-moe dir")
    parser.add_argument("--work-dir", type=Path, help="keep the model and logs here")
    parser.add_argument("--repeats", type=int, default=5, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per prompt")
    parser.add_argument("--connector", default="P2pNcclAFDConnector")
    parser.add_argument("--modes", default="eager,graphs", help="eager and/or graphs")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--sizes", default="{}", help="JSON merged over the wide sizes")
    args = parser.parse_args()
    modes = args.modes.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-gpu-bench-"))
    sizes = WIDE | json.loads(args.sizes)
    model = wide_model(args.tiny_model, work, sizes)
    cache = work / "vllm-cache"
    servers: dict[str, str] = {}
    monolithic, deployments = [], []
    try:
        for mode in modes:
            (port,) = free_ports(1)
            spec = ServerSpec(
                name=f"monolithic-{mode}",
                model=model,
                port=port,
                enforce_eager=mode == "eager",
                extra_args=(*server_args(graphs=mode == "graphs"), *SERVING_ARGS),
                extra_env={"CUDA_VISIBLE_DEVICES": "0"},
            )
            server = VllmServer(spec, work / "logs", cache)
            server.start()
            monolithic.append((mode, server))
        specs = {
            mode: DeploymentSpec(
                model=model,
                connector=args.connector,
                enforce_eager=mode == "eager",
                extra_args=(*server_args(graphs=mode == "graphs"), *SERVING_ARGS),
                role_env={
                    "attention": {"CUDA_VISIBLE_DEVICES": "0"},
                    "ffn": {"CUDA_VISIBLE_DEVICES": "1"},
                },
                start_timeout_s=START_TIMEOUT_S,
            )
            for mode in modes
        }
        for mode, spec in specs.items():
            deployments.append(
                LocalDeployment(spec, work_dir=work / f"logs-afd-{mode}", cache_root=cache)
            )
        with ThreadPoolExecutor(len(deployments)) as pool:  # start them side by side
            list(pool.map(LocalDeployment.start, deployments))
        for mode, deployment in zip(specs, deployments, strict=True):
            servers[f"afd-{mode}"] = deployment.endpoint
        for mode, server in monolithic:
            took = server.wait_healthy(time.monotonic() + START_TIMEOUT_S)
            print(f"monolithic-{mode} healthy after {took:.1f} s")
            servers[f"monolithic-{mode}"] = server.url
        times: dict[tuple[str, int], list[float]] = {}
        for batch in batches:
            for url in servers.values():  # untimed: the first request of a batch size
                per_token_ms(url, model.name, batch, 4)
            for _ in range(args.repeats):
                for label, url in servers.items():
                    times.setdefault((label, batch), []).append(
                        per_token_ms(url, model.name, batch, args.max_tokens)
                    )
            print(
                f"  B={batch}: "
                + ", ".join(f"{k[0]} {v}" for k, v in times.items() if k[1] == batch)
            )
        for deployment in deployments:
            print(f"FFN stats {deployment.ffn_stats()}")
    finally:
        for deployment in deployments:
            deployment.stop()
        for _, server in monolithic:
            server.stop()
    print()
    print(
        f"decode time per step (ms) of {model.name} (hidden {sizes['hidden_size']}, "
        f"{sizes['num_hidden_layers']} layers, {sizes['num_experts']} experts top-"
        f"{sizes['num_experts_per_tok']}, bf16), median of {args.repeats} streaming requests "
        f"of B prompts x {args.max_tokens} tokens; AFD 1A1F over {args.connector} (attention "
        "GPU 0, FFN GPU 1) vs monolithic (GPU 0)"
    )
    header = " | ".join(f"{'mono ' + m:>11} {'AFD ' + m:>11} {'ratio':>5}" for m in modes)
    print(f"{'B':>4} | {header}")
    for batch in batches:
        cells = []
        for mode in modes:
            mono = statistics.median(times[(f"monolithic-{mode}", batch)])
            afd = statistics.median(times[(f"afd-{mode}", batch)])
            cells.append(f"{mono:>11.2f} {afd:>11.2f} {afd / mono:>5.2f}")
        print(f"{batch:>4} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
