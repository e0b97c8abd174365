"""``connector_extra_config`` of the CAM connectors, parsed strictly.

The keys are the prior art's: ``core_num`` (the AI vector cores an op may use, 8 by
default), ``attn_core_num`` and ``ffn_core_num`` (per role; 0: ``core_num``) and
``quant_mode`` (0 only: the ops move bf16 activations; quantised transfer is not built).
On CPU the reference ops ignore the core counts; the Ascend kernels take them as
``aiv_num``. CAM async also takes ``async_moe_ubatching`` (false by default): true runs
every step that splits as two stages pipelined through the MoE layers
(:class:`CamAsyncExtraConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from afd_core.config.coercion import reject_unknown_fields, to_bool, to_int_at_least
from afd_core.config.partials import KEY as PARTIALS_KEY
from afd_core.config.partials import PartialsDtype, parse_partials_dtype
from afd_core.errors import AFDConfigError
from afd_core.topology import Role


@dataclass(frozen=True)
class CamExtraConfig:
    """The parsed ``connector_extra_config`` (see the module docstring)."""

    core_num: int = 8
    attn_core_num: int = 0
    ffn_core_num: int = 0
    quant_mode: int = 0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], connector: str) -> CamExtraConfig:
        """Parse ``raw``; AFDConfigError naming an unknown key or a bad value."""
        reject_unknown_fields(raw, (f.name for f in fields(cls)), connector)
        values = {
            "core_num": to_int_at_least(
                "connector_extra_config.core_num", raw.get("core_num", cls.core_num), 1,
                "give the AI vector cores an op may use",
            ),
            "attn_core_num": to_int_at_least(
                "connector_extra_config.attn_core_num",
                raw.get("attn_core_num", cls.attn_core_num), 0,
                "give the attention role's cores (0: core_num)",
            ),
            "ffn_core_num": to_int_at_least(
                "connector_extra_config.ffn_core_num",
                raw.get("ffn_core_num", cls.ffn_core_num), 0,
                "give the FFN role's cores (0: core_num)",
            ),
            "quant_mode": to_int_at_least(
                "connector_extra_config.quant_mode", raw.get("quant_mode", cls.quant_mode), 0,
                "use 0",
            ),
        }  # fmt: skip
        if values["quant_mode"] != 0:
            raise AFDConfigError(
                f"AFD config: connector_extra_config.quant_mode must be 0 for {connector} "
                f"(quantised transfer is not built), got {values['quant_mode']}"
            )
        return cls(**values)

    def cores_of(self, role: Role) -> int:
        """The ``aiv_num`` the ops of ``role`` get."""
        own = self.attn_core_num if role == "attention" else self.ffn_core_num
        return own or self.core_num


@dataclass(frozen=True)
class CamAsyncExtraConfig:
    """CAM async's ``connector_extra_config``: the CAM keys, ``async_moe_ubatching`` and
    ``partials_dtype`` (``"model"`` or ``"float32"``: the dtype of the expert rows the FFN
    ranks return, :mod:`afd_core.config.partials`)."""

    cam: CamExtraConfig = CamExtraConfig()
    async_moe_ubatching: bool = False
    partials_dtype: PartialsDtype = "model"

    @classmethod
    def parse(cls, raw: Mapping[str, Any], connector: str) -> CamAsyncExtraConfig:
        """Parse ``raw``; AFDConfigError naming an unknown key or a bad value."""
        keys = [f.name for f in fields(CamExtraConfig)] + ["async_moe_ubatching", PARTIALS_KEY]
        reject_unknown_fields(raw, keys, connector)
        ubatching = to_bool(
            "connector_extra_config.async_moe_ubatching", raw.get("async_moe_ubatching", False)
        )
        partials = parse_partials_dtype(raw, connector)
        own = ("async_moe_ubatching", PARTIALS_KEY)
        rest = {key: value for key, value in raw.items() if key not in own}
        return cls(CamExtraConfig.parse(rest, connector), ubatching, partials)

    @property
    def num_stages(self) -> int:
        """Stages per step: 2 with ``async_moe_ubatching``, else 1."""
        return 2 if self.async_moe_ubatching else 1
