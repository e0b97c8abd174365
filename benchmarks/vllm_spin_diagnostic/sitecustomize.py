"""Diagnostic only (``benchmarks/afd_decode.py --vllm-spin-sleep-us N``): vLLM without its
spin-waits.

vLLM's shared-memory message queues (``vllm.distributed.device_communicators.shm_broadcast``)
wait for the next message by calling ``sched_yield()`` in a loop for a second after each
read; an engine core waiting for its worker, and a worker waiting for the next step, each
keep a CPU busy that way. On a host with fewer CPUs than busy processes that CPU is taken
from the processes doing the work. With ``AFD_BENCH_VLLM_SPIN_SLEEP_US`` set, every Python
process started with this directory on ``PYTHONPATH`` replaces that module's
``sched_yield`` by a sleep of that many microseconds when the module is imported, so the
waits give their CPU away (and notice a message later: a sleep costs 90 µs or more on the
2-vCPU development VM). It changes vLLM's timing for monolithic and AFD servers alike;
it is never part of a deployment.
"""

import os

_SLEEP_US = os.environ.get("AFD_BENCH_VLLM_SPIN_SLEEP_US")
_MODULE = "vllm.distributed.device_communicators.shm_broadcast"

if _SLEEP_US:
    import importlib.abc
    import importlib.machinery
    import sys
    import time

    class _SleepInsteadOfYield(importlib.abc.MetaPathFinder):
        """Finds ``_MODULE`` once and patches it right after it is executed."""

        def find_spec(self, name, path, target=None):
            if name != _MODULE:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module
            seconds = int(_SLEEP_US) / 1e6

            def exec_module(module):
                execute(module)
                module.sched_yield = lambda: time.sleep(seconds)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _SleepInsteadOfYield())
