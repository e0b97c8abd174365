"""Attention tensor parallelism on CUDA: an attention server with ``--tensor-parallel-size
2`` over ``P2pGlooAFDConnector``, against monolithic vLLM at TP 2 (the CPU cases are
tests/e2e_cpu/test_attention_tp.py).

The two TP ranks of the attention server take both role GPUs (``$AFD_E2E_ROLE_GPUS``);
the FFN server shares the first one (gloo moves the data through the host). Eager, on
vLLM's default runner. Needs two GPUs: it skips, saying so, on a host with fewer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import MonolithicServers, complete
from tests.e2e_gpu.gpu_settings import cuda_device_count, role_gpus, server_args
from tests.e2e_gpu.test_afd_cuda_exactness import (
    LOGPROB_TOLERANCE,
    MAX_TOKENS,
    QWEN,
    START_TIMEOUT_S,
    max_logprob_difference,
)

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

TP = ("--tensor-parallel-size", "2")


def test_attention_with_tp_2_on_cuda_serves_monolithic_tokens(
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
) -> None:
    if cuda_device_count() < 2:
        pytest.skip(f"attention TP 2 needs two GPUs; this host has {cuda_device_count()}")
    first, second = role_gpus()
    both = {"CUDA_VISIBLE_DEVICES": f"{first},{second}"}
    model = tiny_models / QWEN
    reference = complete(
        monolithic_servers.get(model, extra_env=both, extra_args=(*server_args(), *TP)).url,
        PROMPTS,
        MAX_TOKENS,
    )
    spec = DeploymentSpec(
        model=model,
        extra_args=server_args(),
        role_args={"attention": TP},
        role_env={"attention": both, "ffn": {"CUDA_VISIBLE_DEVICES": first}},
        start_timeout_s=START_TIMEOUT_S,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        afd = complete(deployment.endpoint, PROMPTS, MAX_TOKENS)
        leader, follower = deployment.attention_stats()
        (ffn,) = deployment.ffn_stats()
    assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
    assert max_logprob_difference(afd, reference) <= LOGPROB_TOLERANCE
    assert follower["tensor_parallel_rank"] == 1 and follower["exchanges"] > 0
    assert ffn["steps"] == leader["steps"]  # one sender per attention rank
