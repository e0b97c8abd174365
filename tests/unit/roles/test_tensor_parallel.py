"""Attention TP followers: what the runner and the exchange op get on a TP rank other
than the leader (the leader's side is StepDriver's ``share_output``)."""

from __future__ import annotations

import pytest

from afd_attention.step_driver import SCHEDULED, StepFlags
from afd_attention.tensor_parallel import TPFollower
from afd_core.errors import AFDConfigError

torch = pytest.importorskip("torch")


def leader_results(*values: float):
    """A stand-in for the TP broadcast: fills each tensor with the leader's next value."""
    results = iter(values)
    received = []

    def broadcast(tensor):
        tensor.fill_(next(results))
        received.append(tensor)
        return tensor

    return broadcast, received


def test_each_exchange_returns_the_leaders_broadcast_result_in_a_new_tensor():
    broadcast, received = leader_results(1.5, -2.0)
    follower = TPFollower(broadcast)
    hidden = torch.zeros(3, 4, dtype=torch.bfloat16)
    first = follower.exchange(hidden, torch.zeros(3, 8), 0)
    second = follower.exchange_experts(hidden, torch.ones(3, 2), torch.zeros(3, 2), 1)
    assert received == [first, second] and follower.exchanges == 2
    assert first.shape == hidden.shape and first.dtype == hidden.dtype
    assert torch.equal(first, torch.full((3, 4), 1.5, dtype=torch.bfloat16))
    assert torch.equal(second, torch.full((3, 4), -2.0, dtype=torch.bfloat16))
    assert first.data_ptr() != hidden.data_ptr() and first.is_contiguous()


def test_a_non_contiguous_hidden_gets_a_contiguous_result():
    broadcast, _ = leader_results(0.0)
    hidden = torch.zeros(4, 3).t()
    assert TPFollower(broadcast).exchange(hidden, None, 0).is_contiguous()


def test_steps_are_the_leaders_to_announce():
    follower = TPFollower(lambda t: t)
    with follower.dummy_flags(StepFlags(is_profile=True)), follower.graph_capture():
        assert follower.begin_step(5, SCHEDULED) is None
    assert follower.replay_step(5, lambda: "replayed") == "replayed"
    with pytest.raises(AFDConfigError, match="tensor_parallel_size > 1"):
        follower.begin_stages((2, 2))


@pytest.mark.parametrize("name", ["dummy_flags", "begin_step", "begin_stages", "graph_capture",
                                  "replay_step", "exchange", "exchange_experts"])  # fmt: skip
def test_the_follower_and_the_step_driver_take_the_runners_calls_alike(name: str) -> None:
    import inspect

    from afd_attention.step_driver import ForwardDriver, StepDriver

    def params(cls: type) -> list[str]:
        return list(inspect.signature(getattr(cls, name)).parameters)

    assert params(TPFollower) == params(StepDriver) == params(ForwardDriver), name
