"""ExpertRoutedAFDConnector carries two stages per step over either data plane: over NCCL a
pair's operations run in posting order, and the endpoints' order pairs
(tests/unit/roles/test_two_stages_ordered_pairs.py)."""

from __future__ import annotations

import pytest

from afd_connectors_gpu.expert_routed import ExpertRoutedAFDConnector
from afd_core.config import AFDConfig
from afd_core.connector import WireSpec

WIRE = WireSpec(hidden_size=16, dtype="bfloat16", num_exchange_layers=2, top_k=2, num_experts=4)


def build(transport: str) -> ExpertRoutedAFDConnector:
    config = AFDConfig(
        role="attention",
        connector="ExpertRoutedAFDConnector",
        num_attention_ranks=2,
        num_ffn_ranks=2,
        compute_gate_on_attention=True,
        connector_extra_config={"transport": transport},
    )
    return ExpertRoutedAFDConnector(config, 0, WIRE)


def test_two_stages_are_carried() -> None:
    assert ExpertRoutedAFDConnector.capabilities.two_stages


@pytest.mark.parametrize("transport", ["gloo", "nccl"])
def test_construction_opens_nothing(transport: str) -> None:
    assert not build(transport).is_initialized
