"""The process-local registry the CPU kernels find their groups in. No torch needed."""

from __future__ import annotations

import pytest

from afd_ascend_ops import registry
from afd_core.errors import AFDError, AFDShutdown


class Group:
    """A group of one op family."""


class OtherGroup:
    """A group of the other op family."""


def test_a_registered_group_is_found_until_it_is_unregistered():
    group = Group()
    registry.register("test-registry-found", group)
    assert registry.lookup("test-registry-found", Group) is group
    with pytest.raises(AFDError, match="is a Group, not a OtherGroup"):
        registry.lookup("test-registry-found", OtherGroup)
    registry.unregister("test-registry-found")
    registry.unregister("test-registry-found")  # idempotent
    with pytest.raises(AFDShutdown, match="'test-registry-found' was closed"):
        registry.lookup("test-registry-found", Group)


def test_an_unknown_name_says_the_provider_was_not_opened():
    with pytest.raises(registry.UnknownGroupError, match="op provider was not opened"):
        registry.lookup("test-registry-never", Group)


def test_a_name_is_never_taken_twice():
    registry.register("test-registry-twice", object())  # type: ignore[arg-type]
    try:
        with pytest.raises(ValueError, match="already taken"):
            registry.register("test-registry-twice", object())  # type: ignore[arg-type]
    finally:
        registry.unregister("test-registry-twice")
    with pytest.raises(ValueError, match="already taken"):
        registry.register("test-registry-twice", object())  # type: ignore[arg-type]
