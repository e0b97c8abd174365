"""How CAM P2P's op call sites word an op's error: the layer and step the rank waited
for, in the words of afd-core's endpoints. Pure: the ops are stand-ins that raise."""

from __future__ import annotations

import pytest

from afd_connectors_npu.cam_p2p import call_op, layer_of_ffn_step
from afd_core.connector import FFNStep
from afd_core.errors import AFDPeerError, AFDProtocolError, AFDShutdown
from afd_core.failures import Fuse
from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

DOING = "layer 1 of step 100"


def raising(error: Exception):
    def op(*args: object) -> None:
        raise error

    return op


@pytest.mark.parametrize("kind", [AFDPeerError, AFDProtocolError])
def test_an_ops_own_error_keeps_its_type_and_gets_the_step_it_waited_for(kind: type) -> None:
    op = raising(kind("AFD: FFN rank 0 (world rank 0) closed the connection during e2a call 3"))
    with pytest.raises(kind) as error:
        call_op(Fuse("test"), DOING, op)
    assert str(error.value) == (
        "AFD: FFN rank 0 (world rank 0) closed the connection during e2a call 3 "
        "(while waiting for layer 1 of step 100)"
    )


def test_an_op_woken_for_a_lost_peer_raises_the_connectors_failure_with_the_step() -> None:
    fuse = Fuse("test")
    fuse.blow(AFDPeerError("AFD: FFN rank 0 (world rank 0) is gone: its process ended"))
    with pytest.raises(AFDPeerError) as error:
        call_op(fuse, DOING, raising(AFDShutdown("afd_ascend: interrupted")))
    assert str(error.value) == (
        "AFD: FFN rank 0 (world rank 0) is gone: its process ended "
        "(while waiting for layer 1 of step 100)"
    )


def test_an_op_woken_by_close_raises_its_shutdown_unchanged() -> None:
    fuse = Fuse("test")
    fuse.close()
    with pytest.raises(AFDShutdown, match=r"^afd_ascend: interrupted$"):
        call_op(fuse, DOING, raising(AFDShutdown("afd_ascend: interrupted")))


def test_other_errors_and_results_pass_through() -> None:
    with pytest.raises(ValueError, match=r"^hidden_size must be positive$"):
        call_op(Fuse("test"), DOING, raising(ValueError("hidden_size must be positive")))
    assert call_op(Fuse("test"), DOING, lambda a, b: a + b, 2, b=3) == 5


def step(*members: tuple[int, int]) -> FFNStep:
    """An FFN step of (attention rank, step id) members, one token each."""
    payloads = tuple(ControlPayload(s, r, (AFDDPMetadata(r, (1,)),)) for r, s in members)
    return FFNStep(payloads, tuple(r for r, _ in members), tuple((1,) for _ in members))


def test_an_ffn_step_is_named_by_its_step_id_or_by_each_ranks_own() -> None:
    assert layer_of_ffn_step(2, step((0, 7), (1, 7))) == "layer 2 of step 7"
    assert layer_of_ffn_step(2, step((0, 7), (1, 4))) == (
        "layer 2 of step 7 of attention rank 0, step 4 of attention rank 1"
    )
