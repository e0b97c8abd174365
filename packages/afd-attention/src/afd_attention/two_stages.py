"""A step's forward as two stages on the attention role: :class:`TwoStageForward`.

With ``"num_stages": 2`` the attention runner asks :meth:`TwoStageForward.plan` where a
scheduled batch splits (:func:`afd_core.config.stages.plan_request_split` under the config's
:class:`~afd_core.config.stages.StagePolicy`). A batch that splits runs the model once per stage,
each on its part of the batch, through :meth:`TwoStageForward.run`: the stages take turns
on the two threads of a :class:`~afd_attention.stage_scheduler.StageScheduler`, and the
thread that holds the turn runs in its stage's vLLM forward context (its attention
metadata, slot mapping and ``afd_metadata``). The step driver's ``after_send`` is
:attr:`TwoStageForward.checkpoint`, so a stage hands over after every layer's send.

What each stage thread needs from the worker thread is set up here, per step: torch's
inference mode, intra-op thread count, current CUDA device and current CUDA stream are
per thread, so every stage runs in inference mode with the caller's thread count and,
on CUDA, on the caller's device.

Streams on CUDA (``stage_streams``): with ``"per-stage"`` each stage queues
its kernels on a stream of its own, created once per device. Events order them against
the worker thread's stream, at the step's two ends only: both stage streams wait for
what the worker queued before the step (inputs, metadata, KV cache writes), and the
worker's stream waits for both stages before the caller joins their outputs. Within the
step, a stage's exchange (a gloo copy to the host, an NCCL post) orders against its own
stream, so stage 1's kernels run while stage 0's copy or transfer waits, and the other
way round. Memory is safe without ``record_stream``: a block freed on one stream is
reused on that stream only after the next step's start event, which follows everything
the worker's stream queued. With ``"shared"`` (the default until ``"per-stage"`` is shown
faster on a GPU; docs/cuda.md has the 2026-12-07 H100 run) both stages queue on
the worker's stream in the order the turns run them (every host copy of one stage
then waits for the other stage's queued kernels too).
Torch and vLLM are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from afd_attention.stage_scheduler import NUM_STAGES, StageScheduler
from afd_core.config.stages import StagePolicy, StageSlice, StageStreams, plan_request_split


class TwoStageForward:
    """Plans and runs the two stages of an attention rank's steps.

    ``timeout_s`` bounds every wait of the stage threads (it should exceed the
    connector's own waits, so that a connector failure surfaces with its own error).
    ``streams`` says where the stages' kernels queue on CUDA (see the module docstring).
    """

    def __init__(
        self, policy: StagePolicy, *, timeout_s: float, streams: StageStreams = "shared"
    ) -> None:
        self.policy = policy
        self.streams = streams
        self._stage_streams: dict[int, tuple[Any, ...]] = {}
        self._contexts: tuple[Any, ...] = ()
        self._scheduler = StageScheduler(timeout_s=timeout_s, turn_context=self._turn_context)

    @property
    def checkpoint(self) -> Callable[[], None]:
        """The hand-over between the stages: the step driver's ``after_send``."""
        return self._scheduler.checkpoint

    def plan(self, tokens_per_request: Sequence[int]) -> tuple[StageSlice, ...]:
        """The stages of a scheduled batch whose requests schedule these token counts.

        One stage (the whole batch) or two cut at a request boundary; a batch whose
        requests all schedule one token is a batch of decodes (the decode threshold).
        """
        decode_only = max(tokens_per_request, default=1) <= 1
        return plan_request_split(tokens_per_request, self.policy, decode_only=decode_only)

    def run(self, contexts: Sequence[Any], forwards: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run ``forwards[s]()`` in vLLM forward context ``contexts[s]``, taking turns.

        Returns the stages' results in stage order. Raises what a stage raised (the
        other stage is unwound), AFDError when the step stalls or the worker shuts down
        (:meth:`StageScheduler.run_step`).
        """
        import torch

        num_threads = torch.get_num_threads()
        on_cuda = torch.cuda.is_initialized()  # False on CPU builds; no driver call
        device = torch.cuda.current_device() if on_cuda else None
        caller = torch.cuda.current_stream() if on_cuda else None
        streams = self._streams_of(device, caller)
        own = [stream for stream in streams if stream is not caller]

        def in_stage_thread(forward: Callable[[], Any], stream: Any) -> Callable[[], Any]:
            def run_stage() -> Any:
                if torch.get_num_threads() != num_threads:
                    torch.set_num_threads(num_threads)
                if device is not None:
                    torch.cuda.set_device(device)
                with torch.inference_mode(), _on_stream(stream):
                    return forward()

            return run_stage

        for stream in own:
            stream.wait_stream(caller)
        self._contexts = tuple(contexts)
        try:
            return self._scheduler.run_step(
                [in_stage_thread(f, s) for f, s in zip(forwards, streams, strict=True)]
            )
        finally:
            self._contexts = ()
            for stream in own:
                caller.wait_stream(stream)

    def _streams_of(self, device: int | None, caller: Any) -> tuple[Any, ...]:
        """The stream of each stage: its own (made once per device) with ``"per-stage"``
        on CUDA, else the caller's (None on CPU)."""
        if device is None or self.streams == "shared":
            return (caller,) * NUM_STAGES
        if device not in self._stage_streams:
            import torch

            self._stage_streams[device] = tuple(
                torch.cuda.Stream(device=device) for _ in range(NUM_STAGES)
            )
        return self._stage_streams[device]

    def close(self) -> None:
        """Stop the stage threads (bounded; idempotent)."""
        self._scheduler.close()

    def _turn_context(self, stage: int) -> AbstractContextManager[None]:
        from vllm.forward_context import override_forward_context

        return override_forward_context(self._contexts[stage])


def _on_stream(stream: Any) -> AbstractContextManager[Any]:
    """``torch.cuda.stream(stream)``, or nothing without one (CPU)."""
    if stream is None:
        return nullcontext()
    import torch

    return torch.cuda.stream(stream)
