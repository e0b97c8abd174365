"""``AFDConfig``: the validated form of ``vllm_config.additional_config["afd"]``.

The presence of the ``"afd"`` key turns AFD on. :func:`parse_afd_config` turns the raw
mapping into an :class:`AFDConfig` (aliases, coercion, validation against the connector
registry and the chosen connector's own ``connector_extra_config`` parser);
:func:`afd_config_from_vllm` reads it from a vLLM config. Every problem raises
:class:`~afd_core.errors.AFDConfigError` with one line that names the key and the value
and says what to do. docs/configuration.md is the user-facing reference of every key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from afd_core.topology import Role, Topology


@dataclass(frozen=True)
class AFDConfig:
    """One role's AFD settings, validated.

    ``connector_extra_config`` is kept raw here (read-only); the selected connector class
    parses it strictly (``Connector.parse_extra_config``) during validation.
    ``role_rank`` overrides the rank derived from vLLM's data-parallel rank (for
    deployments whose attention ranks are separate servers).
    """

    role: Role
    connector: str
    host: str = "127.0.0.1"
    port: int = 29600
    num_attention_ranks: int = 1
    num_ffn_ranks: int = 1
    async_dp: bool = False
    afd_process_group_timeout_s: int = 120
    compute_gate_on_attention: bool = False
    connector_extra_config: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({})
    )
    role_rank: int | None = None

    @property
    def topology(self) -> Topology:
        """The rank map of this deployment."""
        return Topology(self.num_attention_ranks, self.num_ffn_ranks)

    def shared_view(self) -> dict[str, Any]:
        """The settings both roles must agree on (compared at rendezvous)."""
        return {
            "connector": self.connector,
            "num_attention_ranks": self.num_attention_ranks,
            "num_ffn_ranks": self.num_ffn_ranks,
            "async_dp": self.async_dp,
            "compute_gate_on_attention": self.compute_gate_on_attention,
            "connector_extra_config": dict(self.connector_extra_config),
        }

    def compute_hash(self) -> str:
        """A stable hash of everything that changes what a role compiles or runs."""
        view = self.shared_view() | {"role": self.role}
        return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]
