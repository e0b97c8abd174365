"""ReplayWatch: bounds replays the host does not wait for; never polls while paused."""

from __future__ import annotations

import threading
import time

from afd_connectors_gpu.replay_watch import ReplayWatch


class FakeEvent:
    """A CUDA event stand-in: done once ``done`` is set; counts its queries."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_completed_replays_are_forgotten_and_nothing_times_out():
    overruns: list[int] = []
    watch = ReplayWatch(0.5, overruns.append, "test-watch")
    try:
        event = FakeEvent()
        watch.add(7, event)
        assert watch.pending() == 1
        event.done = True
        wait_until(lambda: watch.pending() == 0)
        time.sleep(0.6)
        assert overruns == []
    finally:
        watch.stop()


def test_a_replay_that_overruns_the_timeout_is_reported_once():
    overruns: list[int] = []
    watch = ReplayWatch(0.05, overruns.append, "test-watch")
    watch.add(3, FakeEvent())
    watch.add(4, FakeEvent())
    wait_until(lambda: overruns == [3])
    time.sleep(0.1)
    assert overruns == [3]
    watch.stop()


def test_a_paused_watch_makes_no_query_and_drain_waits_for_completion():
    overruns: list[int] = []
    watch = ReplayWatch(5.0, overruns.append, "test-watch")
    try:
        event = FakeEvent()
        watch.add(1, event)
        wait_until(lambda: event.queries > 0)
        watch.pause()
        seen = event.queries
        time.sleep(0.05)
        assert event.queries == seen  # a graph capture may run now
        threading.Timer(0.05, lambda: setattr(event, "done", True)).start()
        assert watch.drain(time.monotonic() + 5, lambda: False)
        assert watch.pending() == 0
        watch.resume()
    finally:
        watch.stop()


def test_drain_gives_up_at_its_deadline_or_when_told_to_stop():
    watch = ReplayWatch(60.0, lambda step: None, "test-watch")
    try:
        watch.add(1, FakeEvent())
        assert not watch.drain(time.monotonic() + 0.05, lambda: False)
        assert not watch.drain(time.monotonic() + 5, lambda: True)
    finally:
        watch.stop()
