"""AFD ranges in torch profiler traces: where a step's time goes, on either role.

The role workers switch the ranges on while a profile of their process runs
(:func:`set_ranges_enabled`, from their ``profile`` method) and off when it stops. While
off, :func:`afd_range` returns one shared no-op context manager: the hot path pays a flag
check and nothing else, and torch's profiler is not touched. While on, each range is a
``torch.profiler.record_function`` and appears in the trace under its name:

==========================  ========  ===================================================
range                       role      what it covers
==========================  ========  ===================================================
``afd.attention.begin``     attention announcing a step (its control payload)
``afd.attention.send``      attention posting one layer's hidden states (and routing)
``afd.attention.wait``      attention waiting for that layer's FFN result, copy included
``afd.ffn.wait_step``       FFN      waiting for the next step (idle time included)
``afd.ffn.step``            FFN      one whole step, every layer and stage
``afd.ffn.recv``            FFN      receiving one layer's batch
``afd.ffn.compute``         FFN      the FFN (or routed experts) of that batch
``afd.ffn.send``            FFN      sending its result back
==========================  ========  ===================================================

Each range also carries the layer in its name (``afd.ffn.compute.L3``) where there is
one, so per-layer costs can be told apart. Platform independent: torch is imported only
when ranges are switched on.

Writing a trace holds the GIL for seconds, so no heartbeat of the process goes out: a
role worker writes it inside :func:`busy` (the busy spell of
:func:`afd_core.runtime.liveness.busy`, public here so that role packages import no
runtime module), and its AFD peers tolerate the silence up to the AFD timeout.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

from afd_core.runtime.liveness import busy as busy

ATTENTION_BEGIN = "afd.attention.begin"
ATTENTION_SEND = "afd.attention.send"
ATTENTION_WAIT = "afd.attention.wait"
FFN_WAIT_STEP = "afd.ffn.wait_step"
FFN_STEP = "afd.ffn.step"
FFN_RECV = "afd.ffn.recv"
FFN_COMPUTE = "afd.ffn.compute"
FFN_SEND = "afd.ffn.send"
#: Every range name (without the ``.L<layer>`` suffix).
RANGES = (
    ATTENTION_BEGIN,
    ATTENTION_SEND,
    ATTENTION_WAIT,
    FFN_WAIT_STEP,
    FFN_STEP,
    FFN_RECV,
    FFN_COMPUTE,
    FFN_SEND,
)

_NO_RANGE: AbstractContextManager[None] = contextlib.nullcontext()
_record_function: Any = None


def trace_prefix(role: str, role_rank: int, prefix: str | None = None) -> str:
    """The trace name prefix of one rank: ``afd-<role><rank>``, then ``-<prefix>`` when
    the user gave one to ``/start_profile`` (vLLM appends its own rank suffix)."""
    name = f"afd-{role}{role_rank}"
    return f"{name}-{prefix}" if prefix else name


def set_ranges_enabled(enabled: bool) -> None:
    """Switch the AFD ranges of this process on (a profile runs) or off."""
    global _record_function
    if enabled:
        import torch.profiler

        _record_function = torch.profiler.record_function
    else:
        _record_function = None


def ranges_enabled() -> bool:
    """Whether :func:`afd_range` records ranges now."""
    return _record_function is not None


def afd_range(name: str, layer: int | None = None) -> AbstractContextManager[Any]:
    """The range ``name`` (``.L<layer>`` appended when given) while ranges are on; the
    shared no-op context otherwise."""
    record = _record_function
    if record is None:
        return _NO_RANGE
    return record(name if layer is None else f"{name}.L{layer}")
