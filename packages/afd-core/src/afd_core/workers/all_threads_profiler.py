"""A role worker's torch profiler that records every thread of its process.

vLLM's worker profiler records ``record_function`` ranges of the thread that starts it
only (CUPTI's kernels come from every thread). On both roles AFD's work runs on other
threads too: an FFN rank computes on its ``afd-ffn-server`` thread, never on the
worker's RPC thread that starts the profile; an attention rank runs a two-stage step's
exchanges on its stage threads. :class:`AllThreadsProfiler` is a vLLM
``WorkerProfiler`` (so ``--profiler-config``, ``/start_profile`` and ``/stop_profile``,
``delay_iterations`` and ``max_iterations`` mean what they mean in vLLM) whose torch
profiler records every thread (``profile_all_threads``) and switches the AFD ranges of
:mod:`afd_core.workers.profiling` on while it runs. Its iterations are what the role
counts: engine steps on the attention role (vLLM's worker steps it), FFN steps on the
FFN role (the server thread steps it after each step served).

Settings read from vLLM's ``ProfilerConfig``: ``torch_profiler_dir``,
``torch_profiler_use_gzip``, ``torch_profiler_record_shapes``,
``torch_profiler_with_memory``, ``torch_profiler_with_stack``,
``torch_profiler_with_flops``, ``torch_profiler_activities``,
``wait_iterations``/``warmup_iterations``/``active_iterations`` (a schedule),
``delay_iterations`` and ``max_iterations``. Not done (vLLM's ``TorchProfilerWrapper``
does them): the time tables (``torch_profiler_dump_cuda_time_total``) and the vLLM
version in the trace's metadata. The trace is written when the profile stops
(``/stop_profile``, the iteration limit, or the worker's shutdown), under the name the
worker gives it (:meth:`set_output_name`).

Two names here are not public API, on purpose: ``_start``/``_stop``/``_profiler_step``
are the hooks vLLM's ``WorkerProfiler`` declares for its subclasses, and
``torch.profiler._ExperimentalConfig`` is the only way torch 2.13 offers to record
threads other than the one that starts the profile.
"""

from __future__ import annotations

import torch
from vllm.config import ProfilerConfig
from vllm.profiler.wrapper import WorkerProfiler

from afd_core.workers.profiling import busy, set_ranges_enabled


class AllThreadsProfiler(WorkerProfiler):
    """A torch profiler of every thread of a role worker's process (module docstring)."""

    def __init__(self, profiler_config: ProfilerConfig, worker_name: str, cuda: bool) -> None:
        """``cuda``: record CUDA activity too (unless ``torch_profiler_activities`` says
        otherwise)."""
        super().__init__(profiler_config)
        self._config = profiler_config
        self._worker_name = worker_name
        configured = profiler_config.torch_profiler_activities
        names = tuple(configured) if configured else ("CPU", "CUDA") if cuda else ("CPU",)
        self._activities = [getattr(torch.profiler.ProfilerActivity, name) for name in names]
        self._uses_schedule = (
            profiler_config.wait_iterations > 0 or profiler_config.warmup_iterations > 0
        )
        self.profiler: torch.profiler.profile | None = None

    @property
    def worker_name(self) -> str:
        """The name the next trace is written under."""
        return self._worker_name

    def set_output_name(self, worker_name: str) -> None:
        """Name the next trace (ignored while a profile runs)."""
        if not self.is_running:
            self._worker_name = worker_name

    def _start(self) -> None:
        config = self._config
        schedule = None
        if self._uses_schedule:
            schedule = torch.profiler.schedule(
                wait=config.wait_iterations,
                warmup=config.warmup_iterations,
                active=config.active_iterations,
                repeat=1,
            )
        self.profiler = torch.profiler.profile(
            activities=self._activities,
            schedule=schedule,
            record_shapes=config.torch_profiler_record_shapes,
            profile_memory=config.torch_profiler_with_memory,
            with_stack=config.torch_profiler_with_stack,
            with_flops=config.torch_profiler_with_flops,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                config.torch_profiler_dir,
                worker_name=self._worker_name,
                use_gzip=config.torch_profiler_use_gzip,
            ),
            experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True),
        )
        set_ranges_enabled(True)
        self.profiler.start()

    def _stop(self) -> None:
        set_ranges_enabled(False)
        if self.profiler is not None:
            # Writing the trace holds the GIL for seconds: no heartbeat could go out.
            with busy():
                self.profiler.stop()  # writes the trace (on_trace_ready)

    def _profiler_step(self) -> bool:
        if self._uses_schedule and self.profiler is not None:
            self.profiler.step()
        return True


def worker_profiler(
    current: WorkerProfiler | None,
    config: ProfilerConfig | None,
    worker_name: str,
    device: torch.device,
) -> WorkerProfiler | None:
    """The profiler a role worker should hold before ``/start_profile``: ``current`` when
    there is one or ``config`` names no ``torch`` profiler (vLLM then makes its own), else
    a new :class:`AllThreadsProfiler` named ``worker_name``, recording CUDA activity on a
    CUDA ``device``."""
    if current is not None or config is None or config.profiler != "torch":
        return current
    return AllThreadsProfiler(config, worker_name=worker_name, cuda=device.type == "cuda")
