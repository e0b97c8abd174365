"""Calling an op of an op-provided data plane from an endpoint: :func:`call_op`."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from afd_core.errors import AFDError, AFDShutdown
from afd_core.failures import Fuse

P = ParamSpec("P")
R = TypeVar("R")


def call_op(fuse: Fuse, doing: str, op: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``op(*args)`` while this rank waits for ``doing`` (``"layer 3 of step 17"``).

    An op woken by an interrupt raises the connector's failure when a lost peer caused
    it (AFDShutdown only when the connector was closed); that failure and the op's own
    AFD errors (which name the op call and its group, not the step) get "(while waiting
    for <doing>)" appended, the wording of afd-core's endpoints.
    """
    try:
        return op(*args, **kwargs)
    except AFDShutdown:
        if fuse.failure is None:
            raise
        error: AFDError = fuse.failure
    except AFDError as exc:
        error = exc
    raise type(error)(f"{error} (while waiting for {doing})") from None
