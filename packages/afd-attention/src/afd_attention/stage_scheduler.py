"""Two stages of one step taking turns on two reusable threads: :class:`StageScheduler`.

With two stages per step, each stage runs the whole model on its part of the batch, on
its own thread. Only one stage runs at a time: the stages pass one permission (the
*turn*) at fixed checkpoints. The exchange of every layer is ``send``, then
:meth:`StageScheduler.checkpoint` (the turn goes to the other stage), then ``recv``. So
while stage 0's hidden states of a layer are on their FFN round trip, stage 1 computes
its attention of that layer, and the other way round::

    stage 0: attn(L0) send(L0,0) .                   recv(L0,0) attn(L1) send(L1,0) .
    stage 1:                      attn(L0) send(L0,1) .                              recv(L0,1) ...

This is the order the FFN role serves (layer-major: for each layer, for each stage).

Rules, each kept here once:

* stage 0 starts with the turn; a stage that ends hands the turn over for good;
* the thread that takes the turn enters its stage's *turn context* (the attention runner
  installs the stage's vLLM forward context, a module global, there) and leaves it when
  it hands the turn over;
* every wait is bounded by ``timeout_s`` (a wait for the turn, and the caller's wait for
  progress of the step);
* a failure of either stage ends the step: the other stage is woken and unwinds, and
  :meth:`StageScheduler.run_step` raises the failed stage's own exception (the
  connector's error, for a connector failure). A stage that made no progress within
  ``timeout_s`` leaves the scheduler unusable: its thread cannot be stopped;
* :meth:`StageScheduler.close` joins the threads, bounded.

Free of torch and vLLM: tested with fake stages.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from afd_core.errors import AFDError

#: How many stages the scheduler runs (the number of its threads).
NUM_STAGES = 2
#: Seconds :meth:`StageScheduler.close` waits for each thread.
JOIN_TIMEOUT_S = 5.0


def no_turn_context(stage: int) -> AbstractContextManager[None]:
    """The default turn context: nothing to install."""
    return nullcontext()


class _StepAborted(BaseException):
    """Unwinds a stage whose step failed in the other stage (never leaves a thread)."""


class StageScheduler:
    """Runs the two stages of a step on two reusable threads (see the module docstring).

    ``turn_context(stage)`` returns the context a stage's thread is in while it holds
    the turn. ``timeout_s`` bounds every wait. One step at a time: :meth:`run_step` is
    called from one thread (vLLM's worker thread).
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        turn_context: Callable[[int], AbstractContextManager[None]] = no_turn_context,
        name: str = "afd-stage",
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"StageScheduler: timeout_s must be positive, got {timeout_s}")
        self._timeout_s = timeout_s
        self._turn_context = turn_context
        self._name = name
        self._cond = threading.Condition()
        self._local = threading.local()
        self._threads: list[threading.Thread] = []
        # State of the current step, guarded by _cond.
        self._jobs: list[Callable[[], Any] | None] = [None] * NUM_STAGES
        self._generation = 0
        self._turn = 0
        self._running = [False] * NUM_STAGES
        self._results: list[Any] = [None] * NUM_STAGES
        self._error: BaseException | None = None
        self._progress = 0
        self._closed = False
        #: Why the scheduler cannot run another step (a stage that never came back).
        self._broken: str | None = None

    # -- the caller's side -------------------------------------------------------------

    def run_step(self, stages: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run ``stages[s]()`` on stage thread ``s``, taking turns; return their results.

        Needs exactly :data:`NUM_STAGES` callables. Raises the first exception a stage
        raised (the other stage is then unwound), AFDError when the step made no progress
        for ``timeout_s`` or the scheduler is closed or unusable.
        """
        if len(stages) != NUM_STAGES:
            raise ValueError(
                f"StageScheduler.run_step: {len(stages)} stages given, it runs {NUM_STAGES}"
            )
        with self._cond:
            self._check_usable()
            self._start_threads()
            self._generation += 1
            self._jobs = list(stages)
            self._turn = 0
            self._running = [True] * NUM_STAGES
            self._results = [None] * NUM_STAGES
            self._error = None
            self._cond.notify_all()
            self._wait_for_step()
            error = self._error
            if error is None and self._closed:
                error = AFDError("AFD attention: the worker shut down during a two-stage step")
            results = list(self._results)
            self._jobs = [None] * NUM_STAGES
        if error is not None:
            raise error
        return results

    def _wait_for_step(self) -> None:
        """Wait (holding _cond) until both stages ended; bounded by progress."""
        progress, since = self._progress, time.monotonic()
        while any(self._running):
            if self._progress != progress:
                progress, since = self._progress, time.monotonic()
            left = self._timeout_s - (time.monotonic() - since)
            if left <= 0:
                stuck = self._turn
                self._broken = (
                    f"stage {stuck} of a two-stage step made no progress for {self._timeout_s:g} s"
                )
                self._fail(AFDError(f"AFD attention: {self._broken}; the step is abandoned"))
                return
            self._cond.wait(left)

    def close(self) -> None:
        """Stop the threads and join each for at most :data:`JOIN_TIMEOUT_S` (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT_S)

    # -- the stage threads' side -------------------------------------------------------

    def checkpoint(self) -> None:
        """Hand the turn to the other stage and wait until it comes back.

        Called by a stage after it sent a layer's hidden states. A no-op on a thread that
        is not a stage thread (a step of one stage), and while the other stage has ended.
        Raises AFDError when the turn does not come back within ``timeout_s``.
        """
        stage = getattr(self._local, "stage", None)
        if stage is None:
            return
        other = 1 - stage
        with self._cond:
            if not self._running[other]:
                return
            self._leave_turn(stage)
            self._turn = other
            self._progress += 1
            self._cond.notify_all()
            self._await_turn(stage)

    def _await_turn(self, stage: int) -> None:
        """Wait (holding _cond) for ``stage``'s turn, then enter its turn context."""
        deadline = time.monotonic() + self._timeout_s
        while self._turn != stage and self._error is None and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AFDError(
                    f"AFD attention: stage {stage} waited more than {self._timeout_s:g} s "
                    f"for its turn while stage {1 - stage} ran"
                )
            self._cond.wait(left)
        if self._error is not None or self._closed:
            raise _StepAborted
        context = self._turn_context(stage)
        context.__enter__()
        self._local.context = context

    def _leave_turn(self, stage: int) -> None:
        context = getattr(self._local, "context", None)
        self._local.context = None
        if context is not None:
            context.__exit__(None, None, None)

    def _serve(self, stage: int) -> None:
        """Body of stage thread ``stage``: run each step's job of this stage."""
        self._local.stage = stage
        seen = 0
        while True:
            with self._cond:
                while self._generation == seen and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                seen = self._generation
                job = self._jobs[stage]
            self._run_job(stage, job)

    def _run_job(self, stage: int, job: Callable[[], Any] | None) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            with self._cond:
                self._await_turn(stage)
            assert job is not None
            result = job()
        except _StepAborted:
            pass
        except BaseException as exc:  # ends the step: run_step re-raises it
            error = exc
        with self._cond:
            self._leave_turn(stage)
            self._results[stage] = result
            if error is not None and self._error is None:
                self._fail(error)
            self._running[stage] = False
            self._turn = 1 - stage
            self._progress += 1
            self._cond.notify_all()

    # -- helpers (called holding _cond) --------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._cond.notify_all()

    def _check_usable(self) -> None:
        if self._closed:
            raise AFDError("AFD attention: the stage scheduler is closed (worker shutting down)")
        if self._broken is not None:
            raise AFDError(
                f"AFD attention: no further two-stage step can run: {self._broken}; "
                "restart the attention server"
            )

    def _start_threads(self) -> None:
        if self._threads:
            return
        for stage in range(NUM_STAGES):
            thread = threading.Thread(
                target=self._serve, args=(stage,), name=f"{self._name}-{stage}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
