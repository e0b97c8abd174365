"""What a received header's error says: :func:`differing_fields`. Pure Python.

A :class:`~afd_core.kit.channel.Header` that is a dataclass compares itself with the
header its receiver expected through this one function, so every header's mismatch
reads alike ("layer: sent 1, expected 0").
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def differing_fields(received: Any, expected: Any, ignore: tuple[str, ...] = ()) -> list[str]:
    """``"field: sent X, expected Y"`` for every field of the dataclass ``received``
    (not in ``ignore``) whose value differs from ``expected``'s, in field order."""
    return [
        f"{f.name}: sent {getattr(received, f.name)!r}, expected {getattr(expected, f.name)!r}"
        for f in fields(received)
        if f.name not in ignore and getattr(received, f.name) != getattr(expected, f.name)
    ]
