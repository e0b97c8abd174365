"""``partials_dtype``: one key of both expert-routed connectors, parsed strictly (pure)."""

from __future__ import annotations

import pytest

from afd_connectors_gpu.expert_routed import M2NExtraConfig
from afd_connectors_npu.extra_config import CamAsyncExtraConfig
from afd_core.config.partials import parse_partials_dtype, partials_dtype, wire_dtype
from afd_core.errors import AFDConfigError


@pytest.mark.parametrize(
    ("raw", "parsed"), [({}, "model"), ({"partials_dtype": "float32"}, "float32")]
)
def test_the_default_is_the_model_dtype(raw: dict, parsed: str) -> None:
    assert parse_partials_dtype(raw, "X") == parsed == partials_dtype(raw)
    assert wire_dtype(parsed, "bfloat16") == ("float32" if parsed == "float32" else "bfloat16")


@pytest.mark.parametrize("value", ["bfloat16", "fp32", 32])
def test_another_value_is_refused_naming_the_choices(value: object) -> None:
    with pytest.raises(
        AFDConfigError, match=r'partials_dtype of X is .*; use "model" .* or "float32"'
    ):
        parse_partials_dtype({"partials_dtype": value}, "X")


def test_both_expert_routed_connectors_take_the_key() -> None:
    assert M2NExtraConfig.parse({"partials_dtype": "float32"}).partials_dtype == "float32"
    parsed = CamAsyncExtraConfig.parse({"partials_dtype": "float32"}, "CAMAsyncAFDConnector")
    assert parsed.partials_dtype == "float32" and not parsed.async_moe_ubatching
    with pytest.raises(AFDConfigError, match="partials_dtype"):
        M2NExtraConfig.parse({"partials_dtype": "half"})
