"""CAMAsyncAFDConnector's rules without a world: what its config refuses, how
``async_moe_ubatching`` fixes the stages, the eager check, and the attention endpoint's
deferred-receive pairing (per-stage FIFOs) over stand-in ops that record their calls.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from afd_connectors_npu import hooks
from afd_connectors_npu.cam_async import CamAsync, CamAsyncAttentionEndpoint, placement
from afd_connectors_npu.connector import CAMAsyncAFDConnector
from afd_core.assembly import Control, Layout, OpPlane, RuntimeSpec
from afd_core.config import AFDConfig, parse_afd_config
from afd_core.connector import ExpertRouting, WireSpec
from afd_core.errors import AFDConfigError, AFDProtocolError
from afd_core.failures import Fuse
from afd_core.kit.pairing import ALL_TO_ALL
from afd_core.tools.cli import main
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

torch = pytest.importorskip("torch")

CONNECTOR = "CAMAsyncAFDConnector"
WIRE = WireSpec(
    hidden_size=4, dtype="bfloat16", num_exchange_layers=2, router_logits_width=8,
    num_experts=8, top_k=2, exchange_layer_ids=(1, 2), max_num_batched_tokens=64,
)  # fmt: skip


def raw(**changes: Any) -> dict[str, Any]:
    settings = {
        "role": "attention",
        "connector": CONNECTOR,
        "async_dp": True,
        "compute_gate_on_attention": True,
        "num_ffn_ranks": 2,
    }
    settings.update(changes)
    return {k: v for k, v in settings.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"async_dp": None},
            "requires async_dp true (its pattern CAM async announces no steps), got false",
        ),
        ({"compute_gate_on_attention": False}, '"compute_gate_on_attention": true'),
        ({"connector_extra_config": {"depth": 1}}, "unknown fields ['depth']"),
        ({"num_stages": 2}, "num_stages is 2, but CAMAsyncAFDConnector's connector_extra_config"),
        (
            {"num_stages": 1, "connector_extra_config": {"async_moe_ubatching": True}},
            "runs 2 stage",
        ),
    ],
)
def test_the_config_refuses_what_cam_async_cannot_run(changes: dict, says: str) -> None:
    with pytest.raises(AFDConfigError, match=re.escape(says)):
        parse_afd_config(raw(**changes))


@pytest.mark.parametrize(("ubatching", "stages"), [(False, 1), (True, 2)])
def test_async_moe_ubatching_decides_the_stages_per_step(ubatching: bool, stages: int) -> None:
    config = parse_afd_config(raw(connector_extra_config={"async_moe_ubatching": ubatching}))
    assert config.num_stages == stages
    assert config.splits_experts and config.expert_placement == "ceil"
    assert config.topology.pairing == ALL_TO_ALL


def test_its_recipe_has_no_control_plane_and_two_op_groups() -> None:
    config = parse_afd_config(raw())
    recipe = CAMAsyncAFDConnector(config, 0, WIRE).recipe()
    assert (recipe.layout, recipe.control) == (Layout.WORLD, Control.IN_BAND)
    assert isinstance(recipe.data, OpPlane) and recipe.data.num_stages == 2
    assert isinstance(recipe.pattern, CamAsync)
    assert CAMAsyncAFDConnector.sized_by_max_num_batched_tokens


@pytest.mark.parametrize(
    ("wire", "says"),
    [
        (WireSpec(hidden_size=4, dtype="bfloat16", num_exchange_layers=2), "route tokens"),
        (
            WireSpec(
                hidden_size=4,
                dtype="bfloat16",
                num_exchange_layers=2,
                num_experts=8,
                top_k=2,
                router_logits_width=8,
            ),
            "carries no max_num_batched_tokens",
        ),
    ],
)
def test_the_pattern_refuses_a_wire_spec_it_cannot_size(wire: WireSpec, says: str) -> None:
    config = parse_afd_config(raw())
    with pytest.raises(AFDConfigError, match=says):
        CamAsync().check(spec(config, wire))


def test_the_attention_role_must_run_eagerly() -> None:
    config = parse_afd_config(raw())
    lazy = SimpleNamespace(model_config=SimpleNamespace(enforce_eager=False))
    with pytest.raises(AFDConfigError, match="start the attention role with --enforce-eager"):
        hooks.afd_validate(config=config, vllm_config=lazy)
    hooks.afd_validate(config=parse_afd_config(raw(role="ffn")), vllm_config=lazy)
    hooks.afd_validate(
        config=config, vllm_config=SimpleNamespace(model_config=SimpleNamespace(enforce_eager=True))
    )


def test_the_placement_is_the_ops_ceil_rule() -> None:
    config = parse_afd_config(raw(num_ffn_ranks=3))
    wire = WireSpec(**{**WIRE.__dict__, "num_experts": 16, "router_logits_width": 16})
    blocks = [placement(spec(config, wire, f)).block(f) for f in range(3)]
    assert [(b.start, b.stop) for b in blocks] == [(0, 6), (6, 12), (12, 16)]


# -- the deferred receive --------------------------------------------------------------


class RecordingOps:
    """Stand-in for CamAsyncOps: records dispatches and combines, combines to ``layer``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def dispatch(self, hidden: Any, ids: Any, layer: int, group: str) -> None:
        self.calls.append(("dispatch", layer, group, hidden.shape[0]))

    def combine(self, anchor: Any, ids: Any, weights: Any, group: str) -> Any:
        self.calls.append(("combine", group, ids.shape[0]))
        return torch.full((ids.shape[0], 4), float(ids[0, 0]) if ids.numel() else 0.0)


def spec(config: AFDConfig, wire: WireSpec = WIRE, rank: int = 0) -> RuntimeSpec:
    return RuntimeSpec(CONNECTOR, config, rank, wire, Fuse(CONNECTOR), lambda error: None)


def endpoint() -> tuple[CamAsyncAttentionEndpoint, RecordingOps]:
    ops = RecordingOps()
    config = parse_afd_config(raw())
    return CamAsyncAttentionEndpoint(spec(config), ops, ("g0", "g1")), ops  # type: ignore[arg-type]


def begin(ep: CamAsyncAttentionEndpoint, step: int, *tokens: int) -> None:
    stages = tuple(AFDDPMetadata(first_rank=0, num_tokens=(n,)) for n in tokens)
    ep.begin_step(ControlPayload(step_id=step, sender_rank=0, stages=stages))


def routed(rows: int, first: int) -> ExpertRouting:
    ids = torch.tensor([[first, 7]] * rows, dtype=torch.int32)
    return ExpertRouting(ids, torch.full((rows, 2), 0.5))


def test_each_stage_receives_its_own_dispatches_in_order() -> None:
    ep, ops = endpoint()
    begin(ep, 0, 3, 2)
    for layer in (1, 2):
        ep.send(layer, 0, torch.zeros(3, 4), routing=routed(3, first=layer * 10 % 7))
        ep.send(layer, 1, torch.zeros(2, 4), routing=routed(2, first=layer))
        # The deferred receives: stage 0's, then stage 1's, each of its own stage's FIFO.
        assert ep.recv(layer, 0)[0, 0] == layer * 10 % 7
        assert ep.recv(layer, 1)[0, 0] == layer
    assert ops.calls == [
        ("dispatch", 1, "g0", 3), ("dispatch", 1, "g1", 2), ("combine", "g0", 3),
        ("combine", "g1", 2), ("dispatch", 2, "g0", 3), ("dispatch", 2, "g1", 2),
        ("combine", "g0", 3), ("combine", "g1", 2),
    ]  # fmt: skip
    stats = ep.stats()
    # Experts 0..3 live on FFN rank 0, 4..7 on FFN rank 1 (ceil(8 / 2) = 4 per rank).
    assert stats["dispatched_tokens"] == {"1": 5, "2": 5}
    # Layer 1: experts (3, 7) x 3 tokens and (1, 7) x 2; layer 2: (6, 7) x 3 and (2, 7) x 2.
    assert stats["dispatched_rows"] == {"0": {"1": 5, "2": 2}, "1": {"1": 5, "2": 8}}
    begin(ep, 1, 4)  # the step was complete: the next one may begin


@pytest.mark.parametrize(
    ("receive", "says"),
    [
        ((1, 1), "stage 1, but sent nothing for that stage"),
        ((2, 0), "asks for the result of layer 2 stage 0, but sent layer 1 first"),
    ],
)
def test_a_receive_that_matches_no_dispatch_of_its_stage_is_refused(receive, says) -> None:
    ep, _ = endpoint()
    begin(ep, 0, 3, 2)
    ep.send(1, 0, torch.zeros(3, 4), routing=routed(3, first=0))
    with pytest.raises(AFDProtocolError, match=says):
        ep.recv(*receive)


def test_a_send_without_routing_or_with_router_logits_is_refused() -> None:
    ep, _ = endpoint()
    begin(ep, 0, 3)
    with pytest.raises(AFDProtocolError, match="send each MoE layer's routing"):
        ep.send(1, 0, torch.zeros(3, 4), router_logits=torch.zeros(3, 8))


def test_a_cam_async_config_says_there_is_no_control_plane_and_when_steps_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = {
        "role": "ffn",
        "connector": "CAMAsyncAFDConnector",
        "async_dp": True,
        "compute_gate_on_attention": True,
        "num_ffn_ranks": 3,
        "connector_extra_config": {"async_moe_ubatching": True},
    }
    assert main(["check", json.dumps(config), "--num-experts", "16"]) == 0
    out = capsys.readouterr().out
    assert "no control plane: each dispatch carries its layer and counts" in out
    assert "control payloads" not in out
    assert "stages: 2 per step: a scheduled batch splits at the request boundary" in out
    assert "routed experts: 16 over 3 FFN rank(s) (ceil blocks)" in out
    assert "FFN 2 holds experts 12..15 (4 experts)" in out


# -- the FFN side: work items -------------------------------------------------------------


class ReceivingOps:
    """Stand-in for CamAsyncOps on an FFN rank: hands out queued dispatches, records answers."""

    def __init__(self, dispatches: list[tuple[int, int, list[int]]]) -> None:
        #: (attention rank, layer, rows per local expert) of each dispatch, in order.
        self.dispatches = list(dispatches)
        self.answers: list[tuple[int, str]] = []

    def receive(self, dtype: Any, group: str) -> tuple[Any, Any, Any]:
        rank, layer, counts = self.dispatches.pop(0)
        rows = sum(counts)
        info = torch.tensor([3, rank, layer, rows, 0, 3] + [0] * (1 + len(counts)))
        return torch.zeros((16, 4), dtype=dtype), info, torch.tensor(counts)

    def answer(self, output: Any, info: Any, group: str) -> None:
        self.answers.append((int(info[1]), group))


def ffn_endpoint(ops: ReceivingOps, num_ffn_ranks: int = 2, rank: int = 0):
    from afd_connectors_npu.cam_async import CamAsyncFFNEndpoint

    config = parse_afd_config(raw(role="ffn", num_ffn_ranks=num_ffn_ranks))
    return CamAsyncFFNEndpoint(spec(config, rank=rank), ops, ("g0", "g1"))  # type: ignore[arg-type]


def test_a_dispatch_becomes_a_work_item_of_expanded_rows_with_unit_weights() -> None:
    ops = ReceivingOps([(1, 1, [2, 0, 1, 1])])
    ep = ffn_endpoint(ops)
    item = ep.next_work(0)
    assert (item.attention_rank, item.layer, item.lane) == (1, 1, 0)
    assert item.hidden.shape == (4, 4)
    assert item.routing.topk_ids.flatten().tolist() == [0, 0, 2, 3]  # grouped by local expert
    assert item.routing.topk_weights.flatten().tolist() == [1.0] * 4  # weights stay on attention
    ep.send_work(item, torch.zeros(4, 4))
    assert ops.answers == [(1, "g0")]
    assert ep.stats() == {"expert_block": [0, 4], "received_rows": {"1": 4}, "work_items": 1,
                          "tokens": 3}  # fmt: skip
    assert ep.num_lanes == 2


def test_each_attention_rank_and_lane_must_send_its_moe_layers_in_order() -> None:
    # Layers 1 and 2 exchange; attention rank 0 sends layer 1 on both lanes, then layer 1
    # again on lane 0 where layer 2 was due.
    ops = ReceivingOps([(0, 1, [1, 0, 0, 0]), (0, 1, [1, 0, 0, 0]), (0, 1, [1, 0, 0, 0])])
    ep = ffn_endpoint(ops)
    ep.next_work(0)
    ep.next_work(1)
    with pytest.raises(
        AFDProtocolError, match="dispatched layer 1 on lane 0 where its layer 2 was due"
    ):
        ep.next_work(0)


def test_rows_for_experts_the_rank_does_not_hold_are_refused() -> None:
    # Three FFN ranks over 8 experts: ceil(8 / 3) = 3 per rank, the last holds 2 (6, 7).
    ops = ReceivingOps([(0, 1, [0, 0, 1])])  # a row for the third of 3 local slots
    ep = ffn_endpoint(ops, num_ffn_ranks=3, rank=2)
    assert ep.stats()["expert_block"] == [6, 8]
    with pytest.raises(AFDProtocolError, match="FFN rank 2 does not hold"):
        ep.next_work(0)
