"""vLLM's ``--kv-transfer-config`` for the two sides of a prefill server in front of AFD.

A prefill server (plain vLLM) is the KV **producer**; the AFD attention servers are the
KV **consumers** (their FFN servers have no KV cache and need no such flag). Both sides
need the same connector, the same ``--block-size`` and the same KV cache dtype: a
connector moves whole blocks of bytes, whose layout is the attention backend's.

:class:`KVTransferSpec` renders the flag; put :meth:`KVTransferSpec.args` on the prefill
server's :attr:`ServerSpec.extra_args <afd_core.tools.launch.ServerSpec.extra_args>` and on the
attention role's :attr:`DeploymentSpec.role_args <afd_core.tools.launch.DeploymentSpec.role_args>`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

#: vLLM's connector that hands KV blocks over as files in a shared directory (CPU and GPU).
EXAMPLE_CONNECTOR = "ExampleConnector"

KVRole = Literal["kv_producer", "kv_consumer"]


@dataclass(frozen=True)
class KVTransferSpec:
    """One server's vLLM KV connector: ``connector`` (a name vLLM's connector factory
    knows), ``role`` and ``extra_config`` (vLLM's ``kv_connector_extra_config``, read by
    the connector)."""

    role: KVRole
    connector: str = EXAMPLE_CONNECTOR
    extra_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def shared_storage(cls, role: KVRole, path: Path) -> KVTransferSpec:
        """``ExampleConnector`` over the directory ``path``, which both sides must reach
        (it holds one folder per prompt, one file per attention layer)."""
        return cls(role=role, extra_config=MappingProxyType({"shared_storage_path": str(path)}))

    def args(self) -> tuple[str, ...]:
        """The vLLM command-line arguments: ``("--kv-transfer-config", JSON)``."""
        config = {
            "kv_connector": self.connector,
            "kv_role": self.role,
            "kv_connector_extra_config": dict(self.extra_config),
        }
        return ("--kv-transfer-config", json.dumps(config, sort_keys=True))
