"""What the attention and FFN workers share: their rank, their model's wire spec, their connector.

A role worker calls, after loading its model:

1. :func:`resolve_role_rank` — this worker's rank in its role, from vLLM's parallel
   config and ``role_rank`` of the AFD config (rejecting layouts the roles cannot run);
2. :func:`model_wire_spec` — the :class:`~afd_core.connector.WireSpec` of the loaded
   model, or a clear error when the model is not an AFD wrapper;
3. :func:`build_connector` — the configured connector class from the registry,
   constructed for this rank (no communication yet: ``initialize()`` is the caller's).

:func:`role_worker_setup` does steps 1 and 2 from vLLM's config (checking that AFD is on
for the worker's role) and returns a :class:`RoleWorkerSetup`, whose
:meth:`~RoleWorkerSetup.new_connector` is step 3: every role worker opens its connector
this way.

Pure Python: vLLM objects are duck-typed, nothing here imports vLLM or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from afd_core.config import AFDConfig, afd_config_from_vllm, connector_class
from afd_core.connector import Connector, WireSpec
from afd_core.errors import AFDConfigError
from afd_core.plugins.registry import get_registry
from afd_core.topology import Role, attention_role_rank, ffn_role_rank


def check_parallel_layout(config: AFDConfig, parallel_config: Any) -> None:
    """Raise AFDConfigError for a vLLM parallel layout the role workers cannot run yet.

    ``parallel_config`` is vLLM's ``ParallelConfig`` (``tensor_parallel_size``,
    ``pipeline_parallel_size``, ``data_parallel_size``). Both roles need pipeline
    parallel size 1. The attention role may use tensor parallelism (an attention rank is
    one data-parallel replica whose TP rank 0 talks to FFN and broadcasts each result to
    the other TP ranks); the FFN role needs tensor parallel size 1, and data parallel
    size 1: its MoE runs outside vLLM's scheduler, so vLLM's data-parallel MoE
    collectives would wait for steps that never come; start one FFN server per FFN rank
    with ``role_rank`` instead.
    """
    keys = ("pipeline_parallel_size",)
    if config.role == "ffn":
        keys = ("tensor_parallel_size", *keys)
    for key in keys:
        size = getattr(parallel_config, key)
        if size != 1:
            raise AFDConfigError(
                f"AFD config: the {config.role} role does not support {key}={size} yet; "
                f"set {key}=1 and scale the role with more ranks (num_{config.role}_ranks)"
            )
    if config.role == "ffn" and parallel_config.data_parallel_size != 1:
        raise AFDConfigError(
            f"AFD config: the ffn role does not support data_parallel_size="
            f"{parallel_config.data_parallel_size}; start one FFN server per FFN rank "
            '(data_parallel_size=1) with "role_rank" set to 0..num_ffn_ranks-1'
        )


def resolve_role_rank(config: AFDConfig, parallel_config: Any, tp_rank: int = 0) -> int:
    """This worker's rank in its role (see :mod:`afd_core.topology`).

    The config's ``role_rank`` wins; otherwise the attention rank is vLLM's data-parallel
    rank and the FFN rank follows :func:`~afd_core.topology.ffn_role_rank`. Raises
    AFDConfigError for an unsupported layout (:func:`check_parallel_layout`) and for a
    rank outside the topology.
    """
    check_parallel_layout(config, parallel_config)
    dp_rank = parallel_config.data_parallel_rank
    if config.role == "attention":
        rank = attention_role_rank(dp_rank, config.role_rank)
    else:
        rank = ffn_role_rank(
            dp_rank, parallel_config.tensor_parallel_size, tp_rank, config.role_rank
        )
    config.topology.world_rank(config.role, rank)  # raises for a rank outside the map
    return rank


def model_wire_spec(model: Any, architecture: str, role: Role) -> WireSpec:
    """The wire spec of a loaded model; AFDConfigError when it is not an AFD wrapper.

    Both roles need ``afd_wire_spec`` and ``afd_exchange_layers``; the FFN role also
    ``afd_compute_ffn``. The error names ``architecture`` and the architectures the
    installed AFD plugins support.
    """
    needed = ["afd_wire_spec", "afd_exchange_layers"]
    if role == "ffn":
        needed.append("afd_compute_ffn")
    missing = [name for name in needed if not callable(getattr(model, name, None))]
    if missing:
        supported = ", ".join(sorted(get_registry().models)) or "none (install afd-models)"
        raise AFDConfigError(
            f"AFD: the model {type(model).__name__} (architecture {architecture!r}) is not an "
            f"AFD {role} model (it lacks {', '.join(missing)}); AFD supports the "
            f"architectures: {supported}. Serve one of those, or register a wrapper for "
            f"{architecture!r} through the afd_models hook"
        )
    wire = model.afd_wire_spec()
    if not isinstance(wire, WireSpec):
        raise AFDConfigError(
            f"AFD: {type(model).__name__}.afd_wire_spec() returned {wire!r}, not an "
            "afd_core.connector.WireSpec; fix the model wrapper"
        )
    return wire


def build_connector(config: AFDConfig, role_rank: int, wire: WireSpec) -> Connector:
    """Construct the configured connector for ``role_rank`` (no rendezvous yet).

    Raises AFDConfigError when the connector name is not registered, AFDInstallError
    when its class cannot be imported or is not a connector
    (:func:`~afd_core.config.connector_class`).
    """
    cls = connector_class(get_registry().connector(config.connector))
    return cls(config, role_rank, wire)


@dataclass(frozen=True)
class RoleWorkerSetup:
    """What a role worker opens its connector with: its AFD ``config``, its ``role_rank``
    and the ``wire`` spec of its loaded model."""

    config: AFDConfig
    role_rank: int
    wire: WireSpec

    def new_connector(self) -> Connector:
        """A new connector for this worker (:func:`build_connector`; no rendezvous yet).

        Each call builds another one (the FFN role builds one per rendezvous).
        """
        return build_connector(self.config, self.role_rank, self.wire)


def role_worker_setup(vllm_config: Any, model: Any, role: Role, tp_rank: int) -> RoleWorkerSetup:
    """The setup of a ``role`` worker whose ``model`` is loaded (steps 1 and 2 above).

    ``vllm_config`` is vLLM's ``VllmConfig`` (duck-typed: ``additional_config``,
    ``parallel_config``, ``model_config.architecture``); ``tp_rank`` the worker's tensor
    parallel rank. Raises AFDConfigError when ``additional_config`` has no "afd" config
    or one for the other role, for a layout the roles cannot run
    (:func:`resolve_role_rank`) and for a model that is not an AFD wrapper
    (:func:`model_wire_spec`). A connector sized by ``max_num_batched_tokens`` gets vLLM's
    value in the wire spec (compared at the rendezvous).
    """
    config = afd_config_from_vllm(vllm_config, expected_role=role)
    if config is None:
        raise AFDConfigError(
            f'AFD: the {role} worker runs without additional_config["afd"]; give the '
            f'deployment an "afd" config with "role": "{role}", or serve it with vLLM\'s '
            "own worker"
        )
    role_rank = resolve_role_rank(config, vllm_config.parallel_config, tp_rank)
    wire = model_wire_spec(model, vllm_config.model_config.architecture, role)
    if connector_class(get_registry().connector(config.connector)).sized_by_max_num_batched_tokens:
        tokens = vllm_config.scheduler_config.max_num_batched_tokens
        wire = replace(wire, max_num_batched_tokens=int(tokens))
    return RoleWorkerSetup(config, role_rank, wire)
