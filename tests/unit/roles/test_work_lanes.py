"""WorkLanes: an in-band FFN endpoint served a thread per lane (pure: a fake endpoint)."""

from __future__ import annotations

import queue
import threading

from afd_core.connector import FFNWorkEndpoint, FFNWorkItem
from afd_core.errors import AFDPeerError, AFDShutdown
from afd_ffn.loops.work_lanes import WorkLanes


class FakeEndpoint(FFNWorkEndpoint):
    """Two lanes fed from queues; ``close`` ends every wait (None, or AFDShutdown on lane 1)."""

    def __init__(self) -> None:
        self.inboxes = [queue.Queue(), queue.Queue()]
        self.sent: list[tuple[int, int]] = []
        self.closed = threading.Event()

    @property
    def num_lanes(self) -> int:
        return 2

    def next_work(self, lane: int) -> FFNWorkItem | None:
        while not self.closed.is_set():
            try:
                item = self.inboxes[lane].get(timeout=0.01)
            except queue.Empty:
                continue
            if isinstance(item, Exception):
                raise item
            return item
        if lane == 1:
            raise AFDShutdown("closed")
        return None

    def send_work(self, item: FFNWorkItem, output: object) -> None:
        self.sent.append((item.lane, item.layer))

    def close(self) -> None:
        self.closed.set()


def item(lane: int, layer: int) -> FFNWorkItem:
    return FFNWorkItem(attention_rank=0, layer=layer, lane=lane, hidden=None, routing=None)  # type: ignore[arg-type]


def run(endpoint: FakeEndpoint, serve) -> threading.Thread:
    lanes = WorkLanes(endpoint, serve, endpoint.close)
    result: list[BaseException] = []

    def body() -> None:
        try:
            lanes.run()
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=body)
    thread.result = result  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_every_lane_serves_its_items_until_the_connector_closes() -> None:
    endpoint = FakeEndpoint()
    served: list[tuple[int, int]] = []
    thread = run(endpoint, lambda i: (served.append((i.lane, i.layer)), endpoint.send_work(i, 0)))
    for layer in (1, 2, 3):
        endpoint.inboxes[0].put(item(0, layer))
        endpoint.inboxes[1].put(item(1, layer))
    while len(endpoint.sent) < 6:
        threading.Event().wait(0.01)
    endpoint.close()
    thread.join(5)
    assert not thread.is_alive() and thread.result == []  # type: ignore[attr-defined]
    assert sorted(served) == [(lane, layer) for lane in (0, 1) for layer in (1, 2, 3)]
    assert [layer for lane, layer in endpoint.sent if lane == 1] == [1, 2, 3]


def test_the_first_lane_error_closes_the_connector_and_is_raised() -> None:
    endpoint = FakeEndpoint()
    thread = run(endpoint, lambda i: endpoint.send_work(i, 0))
    endpoint.inboxes[1].put(AFDPeerError("attention rank 1 is gone"))
    thread.join(5)
    assert not thread.is_alive() and endpoint.closed.is_set()
    (error,) = thread.result  # type: ignore[attr-defined]
    assert isinstance(error, AFDPeerError) and "attention rank 1 is gone" in str(error)


def test_an_error_of_the_computation_ends_serving_too() -> None:
    endpoint = FakeEndpoint()

    def fail(i: FFNWorkItem) -> None:
        raise ValueError(f"layer {i.layer} holds no routed experts")

    thread = run(endpoint, fail)
    endpoint.inboxes[0].put(item(0, 5))
    thread.join(5)
    (error,) = thread.result  # type: ignore[attr-defined]
    assert isinstance(error, ValueError) and endpoint.closed.is_set()
