"""What the per-family end-to-end modules share (test_qwen3_5_moe.py, test_deepseek_v32.py).

* :func:`run_child`: an in-process-engine child (``models_offline_child.py`` and the like)
  in the environment those children need, its JSON report back;
* :func:`check_afd_against_monolithic`: one AFD deployment (a :class:`ServedCase`)
  against a monolithic vLLM server of the same checkpoint: the same greedy tokens, top-5
  logprobs within the suite's tolerance, every FFN rank did work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import MEASURED_TOKENS, PROMPTS
from tests.e2e_cpu.harness import BF16_RTOL, MonolithicServers, complete, first_mismatch

#: New tokens per prompt of the served cases.
MAX_TOKENS = min(12, MEASURED_TOKENS)
#: The suite's tolerances (test_afd_exactness.py, test_expert_routed.py).
LOGPROB_ATOL = 1e-3
EXPERT_ROUTED_RTOL = 2 * BF16_RTOL
EXPERT_ROUTED = "ExpertRoutedAFDConnector"
#: How long one child may take (a few engines on 2 busy cores).
CHILD_TIMEOUT_S = 900


@dataclass(frozen=True)
class ServedCase:
    """One AFD layout of the served cases (one attention rank)."""

    connector: str
    num_ffn_ranks: int
    gate_on_attention: bool

    @property
    def id(self) -> str:
        """The pytest id: ``p2p-1A1F-gate-ffn``, ``expert-routed-1A2F``, ..."""
        if self.connector == EXPERT_ROUTED:
            return f"expert-routed-1A{self.num_ffn_ranks}F"
        gate = "attention" if self.gate_on_attention else "ffn"
        return f"p2p-1A{self.num_ffn_ranks}F-gate-{gate}"


P2P_GATE_ON_FFN = ServedCase("P2pGlooAFDConnector", 1, gate_on_attention=False)
P2P_GATE_ON_ATTENTION = ServedCase("P2pGlooAFDConnector", 1, gate_on_attention=True)
EXPERT_ROUTED_1A2F = ServedCase(EXPERT_ROUTED, 2, gate_on_attention=True)


def run_child(command: Sequence[str], work: Path, report: Path) -> dict[str, Any]:
    """Run ``command`` (which writes the JSON ``report``) with its engines in-process, no
    vLLM plugins and ``work`` as TMPDIR; fail the test with its stderr if it fails."""
    env = os.environ | {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_PLUGINS": "",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "TMPDIR": str(work),
    }
    done = subprocess.run(
        [sys.executable, *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"child process failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(report.read_text())


def check_afd_against_monolithic(
    model: Path,
    monolithic_servers: MonolithicServers,
    cache_root: Path,
    work_dir: Path,
    case: ServedCase,
    extra_args: tuple[str, ...] = (),
) -> None:
    """Serve ``model`` with AFD as ``case`` says and monolithically, both with
    ``extra_args``; assert equal greedy tokens, top-5 logprobs within ``LOGPROB_ATOL`` +
    ``BF16_RTOL`` (expert-routed: ``EXPERT_ROUTED_RTOL``) and work on every FFN rank."""
    server = monolithic_servers.get(model, extra_args=(*monolithic_servers.extra_args, *extra_args))
    reference = complete(server.url, PROMPTS, MAX_TOKENS)
    spec = DeploymentSpec(
        model=model,
        extra_args=extra_args,
        num_attention_ranks=1,
        num_ffn_ranks=case.num_ffn_ranks,
        connector=case.connector,
        compute_gate_on_attention=case.gate_on_attention,
        ffn_first=True,
        stagger_s=3.0,
    )
    with LocalDeployment(spec, work_dir=work_dir, cache_root=cache_root) as deployment:
        (endpoint,) = deployment.endpoints
        afd = complete(endpoint, PROMPTS, MAX_TOKENS)
        ffn_stats = deployment.ffn_stats()
    assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
    routed = case.connector == EXPERT_ROUTED
    rtol = EXPERT_ROUTED_RTOL if routed else BF16_RTOL
    problem = first_mismatch(reference, afd, atol=LOGPROB_ATOL, rtol=rtol)
    assert problem is None, problem
    # The FFN ranks did the work: every one of them received tokens (P2P) or rows.
    counter = "rows" if routed else "tokens"
    assert all(stats[counter] > 0 for stats in ffn_stats), ffn_stats
