"""Where AFD's logprobs differ from monolithic vLLM's on CUDA for models that are not sharp.

The generator's tiny models give AFD exactly monolithic vLLM's logprobs on CUDA; held-out
models with Hugging Face's default initialisation (many router near-ties, lm_head x16)
gave the same greedy tokens but top-5 logprobs 0.07-0.18 nats apart. This script tells
whether that difference is AFD's or vLLM's own batch dependence:

1. ``build DIR`` (any host with transformers): two held-out models, a Qwen3-MoE (hidden
   256, head_dim 64, 16 experts top-4, expert width 128, 3 layers) and a DeepSeek-V2
   (hidden 256, 16 routed experts top-4, one shared expert, MLA), default init, seeded,
   lm_head x16, with the tiny models' tokenizer;
2. ``run DIR`` (one GPU, through the gpu-harness): for each model, a monolithic vLLM
   server and AFD 1A1F over ``P2pGlooAFDConnector`` (both roles on the GPU; one and two
   stages for Qwen3-MoE), V1 runner, eager; every server gets the prompts twice: as one
   request of all four (vLLM batches them as their arrival allows) and one prompt at a
   time (every step has one sequence, so every kernel sees the same batch in every
   server). Prints, per pair of runs, whether greedy tokens are equal and the largest
   |difference| of a top-5 logprob.

If monolithic-batched against monolithic-sequential differs as much as AFD against
monolithic, and AFD-sequential equals monolithic-sequential, the difference is vLLM's
batch-dependent rounding on a model whose routing sits on near-ties, not AFD's.

    python benchmarks/held_out_exactness_gpu.py build /tmp/held-out
    source .gpu-harness/activate.sh dist && python benchmarks/held_out_exactness_gpu.py run DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import Completion, complete
from tests.e2e_gpu.gpu_settings import server_args


def max_logprob_difference(a: list[Completion], b: list[Completion]) -> float:
    """The CUDA exactness tests' measure (imported there, where vLLM is installed)."""
    from tests.e2e_gpu.test_afd_cuda_exactness import max_logprob_difference as measure

    return measure(a, b)


QWEN, DEEPSEEK = "held-out-qwen3-moe", "held-out-deepseek-v2"
MAX_TOKENS = 12
LM_HEAD_SCALE = 16.0
START_TIMEOUT_S = 400.0
V1 = {"VLLM_USE_V2_MODEL_RUNNER": "0"}


def build(out: Path) -> None:
    """Write the two held-out models under ``out``."""
    import torch
    import transformers

    from afd_models.tiny.tokenizer import build_tokenizer

    classes = {
        QWEN: transformers.Qwen3MoeForCausalLM,
        DEEPSEEK: transformers.DeepseekV2ForCausalLM,
    }
    tokenizer = build_tokenizer(0)
    ids = {
        "vocab_size": 1024,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    configs = {
        QWEN: transformers.Qwen3MoeConfig(
            hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            num_experts=16, num_experts_per_tok=4, decoder_sparse_step=1, **ids,
        ),
        DEEPSEEK: transformers.DeepseekV2Config(
            hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=32,
            qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=16, num_experts_per_tok=4,
            n_shared_experts=1, topk_method="greedy", n_group=1, topk_group=1, **ids,
        ),
    }  # fmt: skip
    for name, config in configs.items():
        torch.manual_seed(0)
        model = classes[name](config)
        with torch.no_grad():
            model.lm_head.weight.mul_(LM_HEAD_SCALE)
        model.to(torch.bfloat16).save_pretrained(str(out / name), safe_serialization=True)
        tokenizer.save_pretrained(str(out / name))
        print(f"built {out / name}")


def _both(url: str) -> dict[str, list[Completion]]:
    batched = complete(url, PROMPTS, MAX_TOKENS)
    sequential = [complete(url, [p], MAX_TOKENS)[0] for p in PROMPTS]
    return {"batched": batched, "sequential": sequential}


def run(root: Path, work: Path) -> int:
    """Serve both held-out models both ways and print the comparisons."""
    started = time.monotonic()
    with ExitStack() as stack:
        servers: dict[tuple[str, str], str] = {}
        for name in (QWEN, DEEPSEEK):
            mla = name == DEEPSEEK
            (port,) = free_ports(1)
            mono = VllmServer(
                ServerSpec(name=f"mono-{name}", model=root / name, port=port,
                           extra_args=server_args(mla=mla), extra_env=V1),
                work / "logs", work / "cache",
            )  # fmt: skip
            mono.start()
            stack.callback(mono.stop)
            servers[name, "monolithic"] = mono.url
            for stages in (1, 2) if name == QWEN else (1,):
                spec = DeploymentSpec(
                    model=root / name,
                    extra_args=server_args(mla=mla),
                    extra_env=V1,
                    num_stages=stages,
                    stage_decode_token_threshold=2 if stages == 2 else None,
                    stage_prefill_token_threshold=2 if stages == 2 else None,
                    start_timeout_s=START_TIMEOUT_S,
                )
                label = f"AFD {stages} stage(s)"
                deployment = LocalDeployment(
                    spec, work / "logs" / f"{name}-{stages}", work / "cache"
                )
                stack.enter_context(deployment)
                servers[name, label] = deployment.endpoint
            mono.wait_healthy(time.monotonic() + START_TIMEOUT_S)
        for name in (QWEN, DEEPSEEK):
            runs = {label: _both(url) for (n, label), url in servers.items() if n == name}
            mono = runs["monolithic"]
            print(f"{name}:")
            pairs = [("monolithic batched", mono["batched"], "monolithic sequential",
                      mono["sequential"])]  # fmt: skip
            for label, got in runs.items():
                if label == "monolithic":
                    continue
                for how in ("batched", "sequential"):
                    pairs.append((f"{label} {how}", got[how], f"monolithic {how}", mono[how]))
            for left, a, right, b in pairs:
                equal = [c.token_ids for c in a] == [c.token_ids for c in b]
                print(
                    f"  {left:<28} vs {right:<22}: tokens equal {equal}, max |logprob diff| "
                    f"{max_logprob_difference(a, b):.6f} nats"
                )
    print(f"took {time.monotonic() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "run"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/held-out-work"))
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.dir)
        return 0
    return run(args.dir, args.work_dir)


if __name__ == "__main__":
    sys.exit(main())
