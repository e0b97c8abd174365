"""Type coercion for AFD config values (also for connectors' ``connector_extra_config``).

Values reach ``additional_config["afd"]`` as JSON from ``--additional-config`` or as
strings from vLLM's dotted flags (``--additional-config.afd.port=29600``), so every
function accepts the typed value and its plain-text spelling, and nothing looser:
a float is never an integer and a boolean is never a number (nor a number a boolean).

Each function takes the config ``key`` for its error message and raises
:class:`~afd_core.errors.AFDConfigError` with one line that names the key and the value
and says what to write instead. Pure functions, no state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from afd_core.errors import AFDConfigError

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})

_DECIMAL = re.compile(r"[+-]?[0-9]+")
_MAX_SHOWN = 80


def show(value: Any, *, with_type: bool = True) -> str:
    """``repr(value)`` on one line, shortened to about 80 characters, with its type name.

    Example: ``show(8080.5) == "8080.5 (float)"``; ``with_type=False`` leaves out
    `` (float)``.
    """
    text = " ".join(repr(value).split())
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return f"{text} ({type(value).__name__})" if with_type else text


def to_bool(key: str, value: Any) -> bool:
    """Return ``value`` as a bool.

    Accepts ``True``/``False`` and the strings true/false, 1/0, yes/no, on/off (any case,
    surrounding spaces ignored). Rejects numbers (``1`` is not ``true``), other strings
    and every other type.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise AFDConfigError(
        f"AFD config: {key} must be true or false, got {show(value)}; "
        "write true or false (JSON booleans, or one of the strings "
        "true/false, yes/no, on/off, 1/0)"
    )


def to_int(key: str, value: Any) -> int:
    """Return ``value`` as an int.

    Accepts ints and decimal strings (``"8080"``, ``" 12 "``, ``"-3"``). Rejects bools,
    floats (even ``3.0``: a float in an integer setting is usually a typo), other
    strings and every other type.
    """
    if isinstance(value, bool):
        raise AFDConfigError(
            f"AFD config: {key} must be an integer, got {show(value)}; "
            "write a number, not true/false"
        )
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return int(value.strip())
    if isinstance(value, float) and math.isfinite(value):
        hint = (
            f"write it as {int(value)}"
            if value.is_integer()
            else f"write a whole number such as {int(value)}"
        )
        raise AFDConfigError(f"AFD config: {key} must be an integer, got {show(value)}; {hint}")
    raise AFDConfigError(
        f"AFD config: {key} must be an integer, got {show(value)}; "
        "write a whole number in decimal digits"
    )


def to_int_at_least(key: str, value: Any, minimum: int, advice: str) -> int:
    """``to_int`` plus a lower bound; ``advice`` ends the message when the bound fails."""
    number = to_int(key, value)
    if number < minimum:
        raise AFDConfigError(f"AFD config: {key} ({number}) must be >= {minimum}; {advice}")
    return number


def to_int_in_range(key: str, value: Any, minimum: int, maximum: int, advice: str) -> int:
    """``to_int`` plus ``minimum <= value <= maximum``; ``advice`` ends the message."""
    number = to_int(key, value)
    if not minimum <= number <= maximum:
        raise AFDConfigError(
            f"AFD config: {key} ({number}) must be in {minimum}..{maximum}; {advice}"
        )
    return number


def to_str(key: str, value: Any, advice: str) -> str:
    """Return ``value`` stripped of surrounding spaces; it must be a non-empty string."""
    if not isinstance(value, str):
        raise AFDConfigError(f"AFD config: {key} must be a string, got {show(value)}; {advice}")
    text = value.strip()
    if not text:
        raise AFDConfigError(f"AFD config: {key} must not be empty, got {value!r}; {advice}")
    return text


def to_mapping(key: str, value: Any, advice: str) -> Mapping[str, Any]:
    """Return ``value`` unchanged if it is a mapping (a JSON object); raise otherwise."""
    if not isinstance(value, Mapping):
        raise AFDConfigError(
            f"AFD config: {key} must be a mapping (a JSON object), got {show(value)}; {advice}"
        )
    return value


def reject_unknown_fields(
    raw: Mapping[str, Any], accepted: Iterable[str], connector: str, note: str = ""
) -> None:
    """AFDConfigError naming every key of ``connector_extra_config`` ``raw`` that
    ``connector`` does not accept (``note`` ends the message: a hint for the user)."""
    accepted = sorted(accepted)
    unknown = sorted(set(raw) - set(accepted))
    if unknown:
        raise AFDConfigError(
            f"AFD config: connector_extra_config has unknown fields {unknown} for "
            f"{connector}; it accepts only {', '.join(accepted)}{note}"
        )
