"""Strict reads of the JSON objects in a profile: a misspelt key is an error, not a
silently ignored setting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from afd_core.errors import AFDConfigError


def json_object(value: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    """``value`` when it is a JSON object with no key outside ``allowed``; otherwise
    AFDConfigError naming ``where`` and the first unknown key."""
    if not isinstance(value, dict):
        raise AFDConfigError(f"{where} must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise AFDConfigError(
            f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(allowed))}"
        )
    return value
