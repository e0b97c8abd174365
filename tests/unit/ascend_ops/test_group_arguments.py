"""What the reference kernels refuse before any message moves: arguments that disagree
with the group's world, dtypes off the wire, unpaired calls."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from afd_ascend_ops.header import OpsHeader  # noqa: E402
from afd_ascend_ops.reference.group import MISPAIRED, ReferenceGroup  # noqa: E402
from afd_core.errors import AFDProtocolError  # noqa: E402
from afd_core.kit.channel import MessageChannel  # noqa: E402
from afd_core.topology import Topology  # noqa: E402
from tests.unit.ascend_ops.recording import RecordingTransport  # noqa: E402

H = 8


def group(world_rank: int) -> ReferenceGroup:
    """A group of 1 FFN and 2 attention ranks, as world rank ``world_rank`` sees it."""
    channel = MessageChannel(
        "afd_ascend",
        OpsHeader,
        "g",
        RecordingTransport(),
        world_rank,
        Topology(2, 1),
        5.0,
        MISPAIRED,
    )
    return ReferenceGroup(channel)


def test_world_arguments_must_be_the_groups():
    x = torch.ones(2, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expert_rank_size=2, attention_rank_size=2, rank=1"):
        group(1).a2e(x, None, None, 2, H, 2, 2, 2, 1, 0)
    with pytest.raises(ValueError, match="world rank 1"):
        group(1).e2a(x, torch.zeros(2, dtype=torch.int32), 2, H, 2, 1, 2, 2)


def test_only_wire_dtypes_move():
    x = torch.ones(2, H, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x is torch\.float64"):
        group(1).a2e(x, None, None, 2, H, 2, 1, 2, 1, 0)


def test_a_gated_a2e_needs_ids_and_scales_of_its_rows():
    x = torch.ones(2, H, dtype=torch.bfloat16)
    ids = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"expert_ids must be torch.int32 \[2, 2\]"):
        group(1).a2e(x, ids, torch.zeros(2, 2), 2, H, 2, 1, 2, 1, 1)


def test_attention_e2a_without_a2e_is_a_protocol_error():
    x = torch.ones(2, H, dtype=torch.bfloat16)
    with pytest.raises(AFDProtocolError, match="sent nothing with a2e"):
        group(2).e2a(x, torch.zeros(2, dtype=torch.int32), 2, H, 2, 1, 2, 2)


def test_ffn_e2a_rows_must_match_the_counts_a2e_returned():
    out = torch.ones(5, H, dtype=torch.bfloat16)
    with pytest.raises(AFDProtocolError, match="atten_batch_size sums to 4"):
        group(0).e2a(out, torch.tensor([1, 3], dtype=torch.int32), 5, H, 2, 1, 2, 0)
    with pytest.raises(AFDProtocolError, match="atten_batch_size \\[5\\] is not what a2e"):
        group(0).e2a(out, torch.tensor([5], dtype=torch.int32), 5, H, 2, 1, 2, 0)
