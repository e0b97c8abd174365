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
from typing import TYPE_CHECKING

from afd_core.errors import AFDError, AFDShutdown

if TYPE_CHECKING:
    from afd_ascend_ops.reference.group import ReferenceGroup

_lock = threading.Lock()
_groups: dict[str, ReferenceGroup] = {}
_closed: set[str] = set()


class UnknownGroupError(AFDError, LookupError):
    """An op names a group that was never registered in this process."""


def register(name: str, group: ReferenceGroup) -> None:
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


def lookup(name: str) -> ReferenceGroup:
    """The group registered as ``name``.

    Raises AFDShutdown when its provider closed it, UnknownGroupError when no provider
    of this process registered it.
    """
    group = _groups.get(name)
    if group is not None:
        return group
    if name in _closed:
        raise AFDShutdown(f"afd_ascend: the group {name!r} was closed (its op provider is closed)")
    raise UnknownGroupError(
        f"afd_ascend: no group {name!r} in this process; the op provider was not opened "
        "in this process, or the name is not one its open() returned (registered: "
        f"{sorted(_groups) or 'none'})"
    )
