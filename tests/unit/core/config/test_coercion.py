"""Coercion of config values: typed values and their text spellings, nothing looser."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from afd_core.config.coercion import (
    show,
    to_bool,
    to_int,
    to_int_at_least,
    to_int_in_range,
    to_mapping,
    to_str,
)
from afd_core.errors import AFDConfigError


class _MultiLine:
    def __repr__(self) -> str:
        return "line one\nline two"


def error_of(func: Any, *args: Any) -> str:
    """The one-line AFDConfigError message ``func(*args)`` raises."""
    with pytest.raises(AFDConfigError) as info:
        func(*args)
    message = str(info.value)
    assert message.startswith("AFD config: ")
    assert "\n" not in message
    return message


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        to_int("port", "x")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("No", False),
        ("off", False),
        ("0", False),
    ],
)
def test_to_bool_accepts_bools_and_bool_words(value: Any, expected: bool) -> None:
    assert to_bool("flag", value) is expected


@pytest.mark.parametrize("value", [1, 0, 1.0, "maybe", "", "t", None, []])
def test_to_bool_rejects_numbers_other_words_and_other_types(value: Any) -> None:
    message = error_of(to_bool, "flag", value)
    assert message.startswith(f"AFD config: flag must be true or false, got {value!r} (")
    assert "write true or false" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (-3, -3), ("8080", 8080), (" 12 ", 12), ("+7", 7), ("-2", -2)],
)
def test_to_int_accepts_ints_and_decimal_strings(value: Any, expected: int) -> None:
    assert to_int("n", value) == expected


def test_to_int_rejects_bools_as_integers() -> None:
    message = error_of(to_int, "port", True)
    assert message == (
        "AFD config: port must be an integer, got True (bool); write a number, not true/false"
    )


def test_to_int_rejects_a_whole_float_and_says_how_to_write_it() -> None:
    assert error_of(to_int, "port", 3.0) == (
        "AFD config: port must be an integer, got 3.0 (float); write it as 3"
    )


def test_to_int_rejects_a_fractional_float() -> None:
    assert error_of(to_int, "port", 8080.5) == (
        "AFD config: port must be an integer, got 8080.5 (float); write a whole number such as 8080"
    )


@pytest.mark.parametrize(
    "value", ["1.0", "0x10", "1_000", "abc", "", "\u0661\u0662", None, float("nan"), [1]]
)
def test_to_int_rejects_non_decimal_text_and_other_types(value: Any) -> None:
    message = error_of(to_int, "n", value)
    assert message.startswith("AFD config: n must be an integer, got ")
    assert message.endswith("write a whole number in decimal digits")


def test_to_int_at_least_accepts_the_bound_and_rejects_below_it() -> None:
    assert to_int_at_least("n", "1", 1, "fix it") == 1
    assert (
        error_of(to_int_at_least, "n", 0, 1, "fix it") == "AFD config: n (0) must be >= 1; fix it"
    )


@pytest.mark.parametrize("value", [1, 65535])
def test_to_int_in_range_accepts_both_bounds(value: int) -> None:
    assert to_int_in_range("port", value, 1, 65535, "pick one") == value


@pytest.mark.parametrize("value", [0, 65536])
def test_to_int_in_range_rejects_values_past_either_bound(value: int) -> None:
    assert error_of(to_int_in_range, "port", value, 1, 65535, "pick one") == (
        f"AFD config: port ({value}) must be in 1..65535; pick one"
    )


def test_to_str_strips_surrounding_spaces() -> None:
    assert to_str("host", "  h1 ", "advice") == "h1"


def test_to_str_rejects_blank_strings_and_non_strings() -> None:
    assert "host must not be empty, got ' '" in error_of(to_str, "host", " ", "advice")
    assert "host must be a string, got 5 (int); advice" in error_of(to_str, "host", 5, "advice")


@pytest.mark.parametrize("value", [{"a": 1}, MappingProxyType({"a": 1})])
def test_to_mapping_returns_mappings_unchanged(value: Any) -> None:
    assert to_mapping("extra", value, "advice") is value


def test_to_mapping_rejects_a_list() -> None:
    assert error_of(to_mapping, "extra", [1], "advice") == (
        "AFD config: extra must be a mapping (a JSON object), got [1] (list); advice"
    )


def test_show_keeps_values_on_one_short_line() -> None:
    assert show("a\nb") == "'a\\nb' (str)"
    assert show(_MultiLine()) == "line one line two (_MultiLine)"
    assert show([1, 2], with_type=False) == "[1, 2]"
    long = show("x" * 500)
    assert len(long) < 100
    assert long.endswith("... (str)")
