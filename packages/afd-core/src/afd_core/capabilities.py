"""What a connector can carry, and the one check of a deployment against it.

A connector is described once. Its registration (:class:`~afd_core.plugins.specs.ConnectorSpec`)
names it and says where it runs; its class names the pattern its recipe uses
(:attr:`Connector.pattern_type <afd_core.connector.Connector.pattern_type>`: rank map,
expert split, gate placement, control) and what its data plane can carry
(:class:`Capabilities`). :func:`check_connector` reads both: for the config alone when it
is parsed (and by ``afd check``), and with vLLM's decisions about the attention deployment
(:class:`AttentionDeployment`) before any attention worker starts.

Pure Python: no torch, no vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.errors import AFDConfigError, AFDInstallError

if TYPE_CHECKING:
    from afd_core.config import AFDConfig
    from afd_core.connector import Connector
    from afd_core.plugins.specs import ConnectorSpec, Platform

#: vLLM CUDA graph modes the attention role runs: each captured graph is a whole forward,
#: whose control payload the runner sends before the replay. Piecewise graphs replay the
#: exchange between pieces that the runner cannot announce.
WHOLE_FORWARD_MODES = ("NONE", "FULL", "FULL_DECODE_ONLY")


@dataclass(frozen=True)
class Capabilities:
    """What a connector's data plane can carry; the default: eager steps only, two
    stages, attention tensor parallelism.

    ``cuda_graphs``: its attention endpoint runs inside CUDA graphs of whole forwards
    (it implements the graph-step methods of ``AttentionEndpoint``). ``two_stages``: it
    keeps the two micro-batch stages of a layer in flight at once (``"num_stages": 2``).
    ``attention_tp``: its attention role may run tensor parallel (the TP leader opens
    the connector, the followers take each result by broadcast).
    """

    cuda_graphs: bool = False
    two_stages: bool = True
    attention_tp: bool = True


@dataclass(frozen=True)
class AttentionDeployment:
    """What vLLM decided about an attention deployment: its ``platform``, parallel sizes,
    whether it runs Model Runner V2, its resolved CUDA graph mode's name (``"NONE"``
    where nothing is captured, and on every platform but CUDA) and whether its model uses
    MLA attention (read on CUDA only)."""

    platform: Platform
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    use_v2_model_runner: bool = False
    cudagraph_mode: str = "NONE"
    uses_mla: bool = False


def check_connector(
    config: AFDConfig,
    connector: type[Connector],
    deployment: AttentionDeployment | None = None,
    *,
    registered: Mapping[str, ConnectorSpec] | None = None,
) -> None:
    """Raise AFDConfigError when ``config`` asks of ``connector`` what it cannot do.

    Without ``deployment``: the config alone (``async_dp`` against the pattern's control,
    the gate placement against the pattern's, two stages against the capabilities).
    With ``deployment`` (an attention role): also what vLLM would run it with (CUDA
    graphs, two stages on vLLM's runner, tensor parallelism). Each message names the
    key, the values and what to change; with ``registered`` (the registry's connectors)
    a refused ``async_dp`` also names the registered connectors that take it (their
    classes are imported only then).
    """
    name = connector.name or connector.__name__
    _check_async_dp(config, name, connector, registered or {})
    _check_gate(config, name, connector)
    caps = connector.capabilities
    if config.num_stages == 2 and not caps.two_stages:
        raise AFDConfigError(
            f"AFD config: num_stages 2 with {name}: its data plane does not keep two stages "
            'of a layer in flight; set "num_stages": 1 on both roles, or use a connector '
            "that carries two stages"
        )
    if deployment is None:
        return
    if deployment.tensor_parallel_size > 1 and not caps.attention_tp:
        raise AFDConfigError(
            f"AFD config: connector {name} does not run an attention role with "
            f"tensor_parallel_size {deployment.tensor_parallel_size}; use "
            "tensor_parallel_size 1 on the attention deployment, or another connector"
        )
    _check_stages(config, deployment)
    _check_cuda_graphs(name, caps, deployment)


def _check_async_dp(
    config: AFDConfig,
    name: str,
    connector: type[Connector],
    registered: Mapping[str, ConnectorSpec],
) -> None:
    in_band = connector.pattern_type.in_band()
    if config.async_dp and not in_band:
        choices = ", ".join(_in_band_connectors(registered)) or "none registered"
        raise AFDConfigError(
            f"AFD config: async_dp (true) is only valid with a connector whose attention "
            f"ranks step on their own, its pattern carrying in-band counts ({choices}), "
            f"not {name!r}, whose pattern {connector.pattern_type.name} needs announced "
            "steps; remove async_dp or choose such a connector"
        )
    if in_band and not config.async_dp:
        raise AFDConfigError(
            f"AFD config: connector {name!r} requires async_dp true (its pattern "
            f"{connector.pattern_type.name} announces no steps), got false; set "
            '"async_dp": true'
        )


def _in_band_connectors(registered: Mapping[str, ConnectorSpec]) -> list[str]:
    """The registered connectors whose pattern carries in-band counts (those that load)."""
    from afd_core.config import connector_class

    names = []
    for name, spec in sorted(registered.items()):
        try:
            if connector_class(spec).pattern_type.in_band():
                names.append(name)
        except AFDInstallError:
            continue
    return names


def _check_gate(config: AFDConfig, name: str, connector: type[Connector]) -> None:
    pattern = connector.pattern_type
    required = pattern.gate_on_attention
    if required is not None and config.compute_gate_on_attention != required:
        want, got = str(required).lower(), str(config.compute_gate_on_attention).lower()
        raise AFDConfigError(
            f"AFD config: connector {name!r} {pattern.gate_reason}: it requires "
            f"compute_gate_on_attention {want}, got {got}; set "
            f'"compute_gate_on_attention": {want}'
        )


def _check_cuda_graphs(name: str, caps: Capabilities, deployment: AttentionDeployment) -> None:
    """The exchange op runs inside every decoder layer, so a captured mode needs a
    connector that runs in graphs, whole-forward graphs, no data parallelism (its
    idle-rank dummy forwards replay graphs outside the runner's announcement) and no
    tensor parallelism (the TP broadcast of each result has not run inside a graph)."""
    mode = deployment.cudagraph_mode
    if mode == "NONE":
        return
    if not caps.cuda_graphs:
        raise AFDConfigError(
            f"AFD config: connector {name} cannot run inside CUDA graphs, but vLLM would "
            f"capture the attention role's forwards (cudagraph_mode {mode}); pass "
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
    if deployment.data_parallel_size > 1:
        raise AFDConfigError(
            f"AFD config: CUDA graphs (cudagraph_mode {mode}) with data_parallel_size "
            f"{deployment.data_parallel_size} are not supported by the AFD attention role "
            "yet; pass --enforce-eager, or run each attention rank as its own server "
            "(role_rank)"
        )
    if deployment.tensor_parallel_size > 1:
        raise AFDConfigError(
            f"AFD config: CUDA graphs (cudagraph_mode {mode}) with tensor_parallel_size "
            f"{deployment.tensor_parallel_size} are not supported by the AFD attention role "
            "yet; pass --enforce-eager to the attention deployment"
        )


def _check_stages(config: AFDConfig, deployment: AttentionDeployment) -> None:
    """Two stages per step run on vLLM's V1 runners (the CPU worker's ``CPUModelRunner``,
    and on CUDA ``AFDAttentionCUDAModelRunnerV1`` with ``VLLM_USE_V2_MODEL_RUNNER=0``)
    and on Model Runner V2, eagerly and without data
    or tensor parallelism, not on Ascend NPU."""
    if config.num_stages == 1:
        return
    prefix = f"AFD config: num_stages {config.num_stages}"
    platform = deployment.platform
    if platform == "npu":
        raise AFDConfigError(
            f"{prefix} is not built on Ascend NPU: vllm-ascend's V1 runner passes one padded "
            "token count (num_tokens_padded) to each forward, and each stage of a split step "
            'would need its own; set "num_stages": 1 on both roles'
        )
    if platform == "cuda" and deployment.use_v2_model_runner and deployment.uses_mla:
        raise AFDConfigError(
            f"{prefix} on Model Runner V2 is not supported for MLA models (DeepSeek) yet: "
            'its first GPU run failed at the first request (docs/cuda.md, "Two stages on '
            'Model Runner V2"); start the attention servers with VLLM_USE_V2_MODEL_RUNNER=0 '
            '(the V1 runner runs MLA models in two stages), or set "num_stages": 1 on both roles'
        )
    if platform == "cuda" and deployment.cudagraph_mode != "NONE":
        raise AFDConfigError(
            f"{prefix} runs eagerly: CUDA graphs (cudagraph_mode {deployment.cudagraph_mode}) "
            "capture one stage per step; start the attention servers with --enforce-eager, "
            'or set "num_stages": 1 on both roles'
        )
    if deployment.tensor_parallel_size > 1:
        raise AFDConfigError(
            f"{prefix} with tensor_parallel_size {deployment.tensor_parallel_size} is not "
            "supported by the AFD attention role yet (the stage threads of the TP ranks "
            'would have to take turns in step); set "num_stages": 1 on both roles'
        )
    if deployment.data_parallel_size > 1:
        raise AFDConfigError(
            f"{prefix} with data_parallel_size {deployment.data_parallel_size} is not "
            "supported by the AFD attention role yet; run each attention rank as its own "
            'server (role_rank), or set "num_stages": 1 on both roles'
        )
