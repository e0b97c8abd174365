"""StageScheduler: two stages of a step taking turns, against a fake FFN that serves
layer-major; order of events, overlap, turn contexts, failures, shutdown."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from afd_attention.stage_scheduler import StageScheduler
from afd_core.errors import AFDError, AFDPeerError

LAYERS = (0, 1, 2)
#: Bounds every wait of these tests; none is reached unless the code under test hangs.
TIMEOUT_S = 10.0


class Events:
    """A thread-safe log of what happened, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.log: list[tuple[Any, ...]] = []

    def add(self, *event: Any) -> None:
        with self._lock:
            self.log.append(event)

    def index(self, *event: Any) -> int:
        return self.log.index(event)


class FakeFFN:
    """An FFN rank that serves layer-major (for each layer, for each stage), as afd-ffn does,
    on its own thread; the attention side sends and receives through it."""

    def __init__(self, events: Events, layers: tuple[int, ...] = LAYERS) -> None:
        self.events = events
        self.inbox: queue.Queue[tuple[int, int, int]] = queue.Queue()
        self.outboxes = [queue.Queue(), queue.Queue()]
        self.thread = threading.Thread(target=self._serve, args=(layers,), daemon=True)
        self.thread.start()

    def _serve(self, layers: tuple[int, ...]) -> None:
        for layer in layers:
            for stage in (0, 1):
                try:
                    got = self.inbox.get(timeout=TIMEOUT_S)
                except queue.Empty:  # the attention side's step failed
                    return
                assert got[:2] == (layer, stage), f"FFN expected {(layer, stage)}, got {got}"
                self.events.add("ffn", layer, stage)
                self.outboxes[stage].put(got[2] * 10)

    def send(self, layer: int, stage: int, value: int) -> None:
        self.events.add("send", layer, stage)
        self.inbox.put((layer, stage, value))

    def recv(self, layer: int, stage: int) -> int:
        value = self.outboxes[stage].get(timeout=TIMEOUT_S)
        self.events.add("recv", layer, stage)
        return value


class Contexts:
    """Stands in for vLLM's forward context: a module-global 'current stage' that each
    stage's turn context sets and restores, as override_forward_context does."""

    def __init__(self, events: Events) -> None:
        self.current: int | None = None
        self.events = events

    @contextmanager
    def turn(self, stage: int) -> Iterator[None]:
        previous, self.current = self.current, stage
        self.events.add("enter", stage)
        try:
            yield
        finally:
            self.current = previous


def fake_model(
    stage: int,
    scheduler: StageScheduler,
    ffn: FakeFFN,
    contexts: Contexts,
    fail_at: int | None = None,
) -> Any:
    """A forward of one stage: per layer attention, then the exchange (send, checkpoint,
    recv); every attention sees its own stage's context."""
    value = stage + 1
    for layer in LAYERS:
        assert contexts.current == stage, f"stage {stage} ran in stage {contexts.current}'s context"
        ffn.events.add("attn", layer, stage)
        if layer == fail_at:
            raise AFDPeerError(f"AFD: FFN rank 0 is gone (stage {stage}, layer {layer})")
        ffn.send(layer, stage, value)
        scheduler.checkpoint()
        value = ffn.recv(layer, stage)
    return (stage, value)


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def contexts(events: Events) -> Contexts:
    return Contexts(events)


@pytest.fixture
def scheduler(contexts: Contexts) -> Iterator[StageScheduler]:
    scheduler = StageScheduler(timeout_s=TIMEOUT_S, turn_context=contexts.turn)
    yield scheduler
    scheduler.close()


def run(scheduler: StageScheduler, events: Events, contexts: Contexts, **kwargs: Any) -> Any:
    """One step against a fresh FakeFFN; ``s0``/``s1`` give each stage's fake_model options."""
    ffn = FakeFFN(events)

    def stage(s: int) -> Any:
        return fake_model(s, scheduler, ffn, contexts, **kwargs.get(f"s{s}", {}))

    return scheduler.run_step([lambda: stage(0), lambda: stage(1)]), ffn


def test_stages_take_turns_at_the_checkpoints_in_layer_major_order(
    scheduler: StageScheduler, events: Events, contexts: Contexts
) -> None:
    results, _ = run(scheduler, events, contexts)
    assert results == [(0, 1000), (1, 2000)]
    attention_side = [e for e in events.log if e[0] in ("attn", "send", "recv")]
    assert attention_side == [
        ("attn", 0, 0), ("send", 0, 0),
        ("attn", 0, 1), ("send", 0, 1),
        ("recv", 0, 0), ("attn", 1, 0), ("send", 1, 0),
        ("recv", 0, 1), ("attn", 1, 1), ("send", 1, 1),
        ("recv", 1, 0), ("attn", 2, 0), ("send", 2, 0),
        ("recv", 1, 1), ("attn", 2, 1), ("send", 2, 1),
        ("recv", 2, 0),
        ("recv", 2, 1),
    ]  # fmt: skip


def test_one_stages_attention_runs_while_the_other_stages_ffn_round_trip_is_in_flight(
    scheduler: StageScheduler, events: Events, contexts: Contexts
) -> None:
    run(scheduler, events, contexts)
    for layer in LAYERS:
        # Stage 1 computes layer L after stage 0 sent it and before stage 0 has it back.
        assert events.index("send", layer, 0) < events.index("attn", layer, 1)
        assert events.index("attn", layer, 1) < events.index("recv", layer, 0)
        if layer + 1 in LAYERS:  # and stage 0 computes L+1 while stage 1's L is away
            assert events.index("send", layer, 1) < events.index("attn", layer + 1, 0)
            assert events.index("attn", layer + 1, 0) < events.index("recv", layer, 1)


def test_each_turn_installs_its_stages_context_and_the_callers_comes_back(
    scheduler: StageScheduler, events: Events, contexts: Contexts
) -> None:
    contexts.current = None
    run(scheduler, events, contexts)
    enters = [e[1] for e in events.log if e[0] == "enter"]
    # Stage 0 first; then alternating, one turn per exchange of each stage.
    assert enters == [0, 1, 0, 1, 0, 1, 0, 1]
    assert contexts.current is None


def test_the_threads_are_reused_from_step_to_step(
    scheduler: StageScheduler, events: Events, contexts: Contexts
) -> None:
    names = []
    for _ in range(3):
        results = scheduler.run_step([lambda: threading.current_thread(), lambda: 1])
        names.append(results[0])
    assert names[0] is names[1] is names[2]
    assert names[0] is not threading.current_thread()


def test_a_failing_stage_ends_the_step_with_its_own_error_and_the_next_step_runs(
    scheduler: StageScheduler, events: Events, contexts: Contexts
) -> None:
    with pytest.raises(AFDPeerError, match=r"FFN rank 0 is gone \(stage 1, layer 1\)"):
        run(scheduler, events, contexts, s1={"fail_at": 1})
    # Stage 0 was waiting for its turn: it was unwound, not left waiting.
    assert ("recv", 1, 0) not in events.log
    results, _ = run(scheduler, events, contexts)
    assert results == [(0, 1000), (1, 2000)]


def test_a_failure_before_the_first_checkpoint_ends_the_step(
    scheduler: StageScheduler, events: Events, contexts: Contexts
) -> None:
    with pytest.raises(AFDPeerError, match=r"stage 0, layer 0"):
        run(scheduler, events, contexts, s0={"fail_at": 0})
    assert ("attn", 0, 1) not in events.log  # stage 1 never got the turn


def test_a_stage_that_never_comes_back_fails_the_step_and_the_scheduler() -> None:
    scheduler = StageScheduler(timeout_s=0.2)
    release = threading.Event()
    try:
        with pytest.raises(AFDError, match=r"stage 0 of a two-stage step made no progress"):
            scheduler.run_step([lambda: release.wait(TIMEOUT_S), lambda: None])
        with pytest.raises(AFDError, match=r"restart the attention server"):
            scheduler.run_step([lambda: None, lambda: None])
    finally:
        release.set()
        scheduler.close()


def test_checkpoint_outside_a_stage_thread_does_nothing(scheduler: StageScheduler) -> None:
    scheduler.checkpoint()  # a one-stage step runs on the worker thread


def test_close_joins_the_threads_and_refuses_further_steps(scheduler: StageScheduler) -> None:
    scheduler.run_step([lambda: 0, lambda: 1])
    threads = [t for t in threading.enumerate() if t.name.startswith("afd-stage-")]
    assert len(threads) >= 2
    scheduler.close()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(AFDError, match="closed"):
        scheduler.run_step([lambda: 0, lambda: 1])


def test_a_step_needs_two_stages(scheduler: StageScheduler) -> None:
    with pytest.raises(ValueError, match="1 stages given, it runs 2"):
        scheduler.run_step([lambda: 0])
