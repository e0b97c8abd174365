"""Whether DeepEPM2NAFDConnector carries two stages per step: over gloo yes, over NCCL no
(a pair's operations run in posting order; see ``TWO_STAGE_PROBLEM``)."""

from __future__ import annotations

import pytest

from afd_connectors_gpu.deepep_m2n import DeepEPM2NAFDConnector
from afd_connectors_gpu.nccl_transport import TWO_STAGE_PROBLEM
from afd_core.config import AFDConfig
from afd_core.connector import WireSpec

WIRE = WireSpec(hidden_size=16, dtype="bfloat16", num_exchange_layers=2, top_k=2, num_experts=4)


def build(transport: str) -> DeepEPM2NAFDConnector:
    config = AFDConfig(
        role="attention",
        connector="DeepEPM2NAFDConnector",
        num_attention_ranks=2,
        num_ffn_ranks=2,
        compute_gate_on_attention=True,
        connector_extra_config={"transport": transport},
    )
    return DeepEPM2NAFDConnector(config, 0, WIRE)


def test_over_gloo_two_stages_are_carried() -> None:
    assert build("gloo").two_stage_problem() is None


def test_over_nccl_two_stages_are_refused_with_the_reason() -> None:
    assert build("nccl").two_stage_problem() == TWO_STAGE_PROBLEM


@pytest.mark.parametrize("transport", ["gloo", "nccl"])
def test_construction_opens_nothing(transport: str) -> None:
    assert not build(transport).is_initialized
