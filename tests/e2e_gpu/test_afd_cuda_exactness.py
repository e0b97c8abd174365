"""AFD on CUDA serves what monolithic vLLM serves: same greedy tokens, close logprobs.

Each case starts a 1A1F AFD deployment (1A2F for the expert-routed cases: two FFN ranks,
each with half the routed experts; FFN and attention vLLM servers with the CUDA role
workers that ``worker_cls="auto"`` resolves to) and compares what the official ``openai``
client gets from the attention server with what it gets from a plain vLLM server of the
same tiny model under the same model runner (Qwen3-MoE; DeepSeek-V2 with MLA, its shared
expert and dense first layer, on the harness's MLA backends). Coverage: gate on FFN and on
attention, Model Runner V2 (vLLM's CUDA default) and V1 (``VLLM_USE_V2_MODEL_RUNNER=0``), eager and
CUDA graphs, ``FULL_DECODE_ONLY`` and ``FULL`` (NCCL only; the monolithic reference then
captures the same graphs, and the AFD output is also compared with monolithic eager
output: same greedy tokens, and with ``FULL_DECODE_ONLY`` the same logprobs within the
tolerance. Under ``FULL`` vLLM's own logprobs move off eager, most likely because prefill
batches replay padded graphs too: measured on H200 with the earlier, less FFN-dependent
tiny models, AFD with ``FULL`` equals monolithic with ``FULL`` exactly and both differ
from eager by up to 0.125 nats).

With ``P2pGlooAFDConnector`` (a CPU transport) both roles share the attention GPU (GPU 0
unless ``$AFD_E2E_ROLE_GPUS`` says otherwise): the attention role's tensors cross to the
host inside the connector and the FFN server moves what it receives to its GPU. With
``P2pNcclAFDConnector`` the FFN server runs on the FFN GPU (GPU 1; NCCL cannot pair two
processes on one GPU); those cases skip on a host with fewer than two GPUs. Two stages
per step (``num_stages`` 2) run on the V1 runner, eagerly, over gloo (P2P with each
model, and expert-routed) and over NCCL (P2P with each model); the FFN server's counters
show that the steps split. The generator's wide family (``wide-qwen3-moe``,
``wide-deepseek-v2``: hidden 256, 16 experts top-4, the held-out models' shapes) runs
over gloo with both runners, both gates, one and two stages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS
from tests.e2e_cpu.harness import Completion, MonolithicServers, complete
from tests.e2e_cpu.test_afd_exactness import STAGE_TOKEN_THRESHOLD
from tests.e2e_gpu.gpu_settings import cuda_device_count, role_env, server_args

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

QWEN, DEEPSEEK = "tiny-qwen3-moe", "tiny-deepseek-v2"
#: The generator's wide family (hidden 256, head_dim 64, 16 experts top-4, expert width
#: 128): the shapes of the held-out models (docs/testing.md), sharpened like the others.
WIDE_QWEN, WIDE_DEEPSEEK = "wide-qwen3-moe", "wide-deepseek-v2"
WIDE_MODELS = {WIDE_QWEN, WIDE_DEEPSEEK}
#: Models whose attention is MLA (the harness runs them with other attention backends).
MLA_MODELS = {DEEPSEEK, WIDE_DEEPSEEK}
MAX_TOKENS = min(12, MEASURED_TOKENS)
#: Largest accepted |AFD - monolithic| of a top-5 logprob, in nats: the FFN rank runs the
#: same kernels on the same tokens as the monolithic server, so any difference is a bf16
#: rounding of a kernel that chose another tiling for another process.
LOGPROB_TOLERANCE = 0.02
#: What vLLM logs once when a worker runs Model Runner V2.
V2_LOG_LINE = "Using V2 Model Runner"
#: Seconds a deployment may take to become healthy (first start compiles Triton kernels).
START_TIMEOUT_S = 300.0

NCCL = "P2pNcclAFDConnector"
#: The expert-routed connector over gloo: every rank shares the attention GPU.
M2N_GLOO = "ExpertRoutedAFDConnector"

RUNNER_ENV = {
    "v2": {"VLLM_USE_V2_MODEL_RUNNER": "1"},
    "v1": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
}


@dataclass(frozen=True)
class Case:
    """One AFD deployment to compare against monolithic vLLM."""

    runner: str
    gate_on_attention: bool
    connector: str = "P2pGlooAFDConnector"
    ffn_first: bool = True
    graphs: bool = False
    graph_mode: str = "FULL_DECODE_ONLY"
    model: str = QWEN
    #: 2: two stages per step (eager, cut at a request boundary; V2: through vLLM's
    #: micro-batch runner), thresholds low enough that the prompt batch's steps split.
    num_stages: int = 1
    #: Where two stages' kernels queue: both on the worker's stream, or each on its own.
    stage_streams: str = "shared"

    @property
    def mla(self) -> bool:
        """Whether the model uses MLA attention."""
        return self.model in MLA_MODELS

    @property
    def id(self) -> str:
        gate = "gate-attn" if self.gate_on_attention else "gate-ffn"
        order = "ffn-first" if self.ffn_first else "attn-first"
        mode = (
            "eager" if not self.graphs else "graphs" if self.graph_mode != "FULL" else "graphs-full"
        )
        layout = f"1A{self.num_ffn_ranks}F"
        if self.num_stages > 1:
            layout += f"-{self.num_stages}stages"
            if self.stage_streams != "shared":
                layout += f"-{self.stage_streams}-streams"
        return f"{self.model}-{layout}-{gate}-runner-{self.runner}-{self.connector}-{order}-{mode}"

    @property
    def num_ffn_ranks(self) -> int:
        """Two for the expert-routed cases (each FFN rank holds half the experts), else one."""
        return 2 if self.connector == M2N_GLOO else 1

    @property
    def role_env(self) -> dict[str, dict[str, str]]:
        """One GPU per role for NCCL; both roles on the attention GPU otherwise."""
        return role_env(one_gpu_per_role=self.connector == NCCL)


# Both runners and both gate placements are covered by the first two cases.
CASES = [
    Case("v2", gate_on_attention=False),
    Case("v1", gate_on_attention=True),
    Case("v2", gate_on_attention=True),
    Case("v1", gate_on_attention=False),
    Case("v2", gate_on_attention=False, connector=NCCL, ffn_first=False),
    Case("v1", gate_on_attention=True, connector=NCCL, ffn_first=True),
    Case("v2", gate_on_attention=False, connector=NCCL, ffn_first=False, graphs=True),
    Case("v1", gate_on_attention=True, connector=NCCL, ffn_first=True, graphs=True),
    Case("v2", gate_on_attention=True, connector=NCCL, ffn_first=True, graphs=True),
    Case("v1", gate_on_attention=False, connector=NCCL, ffn_first=False, graphs=True),
    Case("v2", gate_on_attention=False, connector=NCCL, graphs=True, graph_mode="FULL"),
    Case("v1", gate_on_attention=True, connector=NCCL, graphs=True, graph_mode="FULL"),
    # Expert-routed over gloo on one GPU: two FFN ranks, each with half the routed experts.
    Case("v2", gate_on_attention=True, connector=M2N_GLOO),
    Case("v1", gate_on_attention=True, connector=M2N_GLOO, model=DEEPSEEK),
    # DeepSeek-V2: one GPU (gloo) and two (NCCL), eager and FULL_DECODE_ONLY graphs.
    Case("v2", gate_on_attention=False, model=DEEPSEEK),
    Case("v1", gate_on_attention=True, model=DEEPSEEK),
    Case("v2", gate_on_attention=True, connector=NCCL, model=DEEPSEEK),
    Case("v2", gate_on_attention=False, connector=NCCL, graphs=True, model=DEEPSEEK),
    # Two stages per step on the V1 runner, eagerly: over gloo (both roles on one GPU) and
    # over NCCL (one GPU per role).
    Case("v1", gate_on_attention=False, num_stages=2),
    Case("v1", gate_on_attention=True, model=DEEPSEEK, num_stages=2),
    Case("v1", gate_on_attention=True, connector=M2N_GLOO, num_stages=2),
    Case("v1", gate_on_attention=False, connector=NCCL, num_stages=2),
    Case("v1", gate_on_attention=True, connector=NCCL, model=DEEPSEEK, num_stages=2),
    # Two stages per step on Model Runner V2 (vLLM's micro-batch runner at DP 1), eagerly.
    Case("v2", gate_on_attention=False, num_stages=2),
    Case("v2", gate_on_attention=True, num_stages=2),
    Case("v2", gate_on_attention=True, model=DEEPSEEK, num_stages=2),
    Case("v2", gate_on_attention=False, num_stages=2, stage_streams="per-stage"),
    Case("v2", gate_on_attention=True, connector=M2N_GLOO, num_stages=2),
    Case("v2", gate_on_attention=True, model=WIDE_QWEN, num_stages=2),
    Case("v2", gate_on_attention=False, connector=NCCL, num_stages=2),
    # The wide family over gloo on one GPU: both runners and gates, one and two stages,
    # expert-routed too (two FFN ranks of eight experts each).
    Case("v2", gate_on_attention=False, model=WIDE_QWEN),
    Case("v1", gate_on_attention=True, model=WIDE_QWEN, num_stages=2),
    Case("v2", gate_on_attention=True, model=WIDE_DEEPSEEK),
    Case("v1", gate_on_attention=False, model=WIDE_DEEPSEEK, num_stages=2),
    Case("v2", gate_on_attention=True, connector=M2N_GLOO, model=WIDE_QWEN),
]


def start_up_refusal(case: Case) -> str | None:
    """What the installed afd-core's start-up check says against ``case``'s attention
    deployment (two stages of an MLA model on Model Runner V2 stay refused until a GPU run
    shows them exact: docs/cuda.md), or None."""
    from afd_core.capabilities import AttentionDeployment, check_connector
    from afd_core.config import AFDConfig, connector_class
    from afd_core.errors import AFDConfigError
    from afd_core.plugins.registry import get_registry

    config = AFDConfig(
        role="attention",
        connector=case.connector,
        compute_gate_on_attention=case.gate_on_attention,
        num_stages=case.num_stages,
    )
    deployment = AttentionDeployment(
        "cuda",
        use_v2_model_runner=case.runner == "v2",
        cudagraph_mode="NONE" if not case.graphs else case.graph_mode,
        uses_mla=case.mla,
    )
    try:
        connector = connector_class(get_registry().connector(case.connector))
        check_connector(config, connector, deployment)
    except AFDConfigError as refused:
        return str(refused)
    return None


def max_logprob_difference(afd: list[Completion], reference: list[Completion]) -> float:
    """Largest |difference| of a logprob of a token both runs list, at any position."""
    worst = 0.0
    for got, want in zip(afd, reference, strict=True):
        for x, y in zip(got.top_logprobs, want.top_logprobs, strict=True):
            for token in set(x) & set(y):
                worst = max(worst, abs(x[token] - y[token]))
    return worst


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_afd_on_cuda_serves_the_same_tokens_as_monolithic_vllm(
    case: Case,
    request: pytest.FixtureRequest,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
) -> None:
    if case.connector == NCCL and cuda_device_count() < 2:
        pytest.skip(f"{NCCL} needs two GPUs (one per role); this host has {cuda_device_count()}")
    refusal = start_up_refusal(case)
    if refusal is not None:
        pytest.skip(f"the installed afd-core refuses this deployment at start-up: {refusal}")
    family = "wide_models" if case.model in WIDE_MODELS else "tiny_models"
    model = request.getfixturevalue(family) / case.model
    env = RUNNER_ENV[case.runner]
    eager_reference = complete(
        monolithic_servers.get(model, extra_env=env, extra_args=server_args(mla=case.mla)).url,
        PROMPTS,
        MAX_TOKENS,
    )
    reference = eager_reference
    if case.graphs:
        graph_server = monolithic_servers.get(
            model,
            enforce_eager=False,
            extra_env=env,
            extra_args=server_args(True, case.graph_mode, mla=case.mla),
        )
        reference = complete(graph_server.url, PROMPTS, MAX_TOKENS)
    spec = DeploymentSpec(
        model=model,
        compute_gate_on_attention=case.gate_on_attention,
        connector=case.connector,
        ffn_first=case.ffn_first,
        stagger_s=3.0,
        enforce_eager=not case.graphs,
        extra_args=server_args(case.graphs, case.graph_mode, mla=case.mla),
        extra_env=env,
        role_env=case.role_env,
        start_timeout_s=START_TIMEOUT_S,
        num_ffn_ranks=case.num_ffn_ranks,
        connector_extra_config={"transport": "gloo"} if case.connector == M2N_GLOO else {},
        num_stages=case.num_stages,
        stage_streams=case.stage_streams if case.num_stages > 1 else None,
        stage_decode_token_threshold=STAGE_TOKEN_THRESHOLD if case.num_stages > 1 else None,
        stage_prefill_token_threshold=STAGE_TOKEN_THRESHOLD if case.num_stages > 1 else None,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        afd = complete(deployment.endpoint, PROMPTS, MAX_TOKENS)
        stats, *other_ffn_stats = deployment.ffn_stats()
        attention_log = deployment.attention_servers[0].log_path.read_text(errors="replace")
    tokens_equal = [c.token_ids for c in afd] == [c.token_ids for c in reference]
    diff = max_logprob_difference(afd, reference)
    eager_tokens_equal = [c.token_ids for c in afd] == [c.token_ids for c in eager_reference]
    eager_diff = max_logprob_difference(afd, eager_reference)
    print(
        f"RESULT {case.id}: tokens equal {tokens_equal} ({len(PROMPTS)} prompts x "
        f"{MAX_TOKENS} tokens), max |logprob diff| {diff:.6f} nats; against monolithic "
        f"eager: tokens equal {eager_tokens_equal}, max |logprob diff| {eager_diff:.6f}; "
        f"FFN stats {stats}"
    )
    if case.graphs:
        # Decode steps replayed graphs on both roles, and greedy tokens do not depend on it.
        assert stats["graphs_captured"] > 0 and stats["graph_replays"] > 0, stats
        assert eager_tokens_equal
        if case.graph_mode == "FULL_DECODE_ONLY":
            assert eager_diff <= LOGPROB_TOLERANCE
    assert (V2_LOG_LINE in attention_log) == (case.runner == "v2")
    assert "AFD attention rank 0: connected" in attention_log
    assert tokens_equal, f"{[c.token_ids for c in afd]} != {[c.token_ids for c in reference]}"
    for got, want in zip(afd, reference, strict=True):
        best = max(want.first_token_logprobs, key=want.first_token_logprobs.__getitem__)
        assert best in got.first_token_logprobs, "the greedy first token is missing from AFD's"
    assert diff <= LOGPROB_TOLERANCE, f"a logprob differs by {diff:.4f} nats"
    config = json.loads((model / "config.json").read_text())
    num_layers = int(config["num_hidden_layers"])
    if case.connector == M2N_GLOO:  # only MoE layers exchange; every FFN rank serves all steps
        num_layers -= int(config.get("first_k_dense_replace", 0))
        assert [s["steps"] for s in other_ffn_stats] == [stats["steps"]]
    # Every decode step crossed every exchanging layer to the FFN rank.
    assert stats["layer_exchanges"] >= num_layers * MAX_TOKENS
    assert stats["layer_exchanges"] % num_layers == 0
    assert stats["tokens"] >= len(PROMPTS) * MAX_TOKENS
    assert (stats["two_stage_steps"] > 0) == (case.num_stages == 2), stats
