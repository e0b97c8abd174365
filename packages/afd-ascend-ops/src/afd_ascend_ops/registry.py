"""The process-local registry of groups the ``afd_ascend`` CPU kernels find by name.

The ops take their communication group as a string (``group_ep`` / ``group_name``). An
op provider opens a group, registers it here under a unique name and hands the name to
the connector; the kernels look it up on every call. A closed name is remembered, so a
call after :meth:`~afd_ascend_ops.reference.ReferenceOpProvider.close` raises
:class:`~afd_core.errors.AFDShutdown` (what an op of a closed provider raises), while a
name never registered in this process raises :class:`UnknownGroupError`.

Pure Python, thread-safe.
"""

from __future__ import annotations

import threading
from typing import TypeVar

from afd_core.errors import AFDError, AFDShutdown

G = TypeVar("G")

_lock = threading.Lock()
_groups: dict[str, object] = {}
_closed: set[str] = set()


class UnknownGroupError(AFDError, LookupError):
    """An op names a group that was never registered in this process."""


def register(name: str, group: object) -> None:
    """Make ``group`` the group of ``name``; ValueError when the name is or was in use."""
    with _lock:
        if name in _groups or name in _closed:
            raise ValueError(f"afd_ascend: the group name {name!r} is already taken")
        _groups[name] = group


def unregister(name: str) -> None:
    """Forget ``name`` (idempotent); later lookups raise AFDShutdown."""
    with _lock:
        if _groups.pop(name, None) is not None:
            _closed.add(name)


def lookup(name: str, kind: type[G]) -> G:
    """The group registered as ``name``, which must be a ``kind`` (the group class of the
    calling op's family).

    Raises AFDShutdown when its provider closed it, UnknownGroupError when no provider
    of this process registered it, AFDError when it is a group of the other op family.
    """
    group = _groups.get(name)
    if isinstance(group, kind):
        return group
    if group is not None:
        raise AFDError(
            f"afd_ascend: the group {name!r} is a {type(group).__name__}, not a "
            f"{kind.__name__}: a2e/e2a run on the groups of CAMP2P's provider, the CAM async "
            "ops on those of CAM async's"
        )
    if name in _closed:
        raise AFDShutdown(f"afd_ascend: the group {name!r} was closed (its op provider is closed)")
    raise UnknownGroupError(
        f"afd_ascend: no group {name!r} in this process; the op provider was not opened "
        "in this process, or the name is not one its open() returned (registered: "
        f"{sorted(_groups) or 'none'})"
    )
