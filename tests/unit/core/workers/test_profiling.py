"""AFD profiler ranges: a shared no-op while off, torch record_function ranges while on."""

from __future__ import annotations

import pytest

from afd_core.workers import profiling
from afd_core.workers.profiling import (
    FFN_COMPUTE,
    afd_range,
    ranges_enabled,
    set_ranges_enabled,
    trace_prefix,
)


def test_ranges_are_one_shared_no_op_while_no_profile_runs() -> None:
    set_ranges_enabled(False)
    assert not ranges_enabled()
    first, second = afd_range(FFN_COMPUTE, 3), afd_range("afd.attention.send")
    assert first is second  # nothing is built per call: the hot path pays a flag check
    with first:
        pass


def test_ranges_become_named_record_functions_while_a_profile_runs() -> None:
    torch = pytest.importorskip("torch", reason="ranges are torch profiler ranges")
    set_ranges_enabled(True)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with afd_range(FFN_COMPUTE, 3):
                torch.ones(2) + 1
            with afd_range("afd.attention.wait"):
                pass
    finally:
        set_ranges_enabled(False)
    names = {event.name for event in prof.events()}
    assert {"afd.ffn.compute.L3", "afd.attention.wait"} <= names
    assert afd_range(FFN_COMPUTE) is afd_range(FFN_COMPUTE)  # off again


def test_trace_names_say_role_and_rank_then_the_users_prefix() -> None:
    assert trace_prefix("ffn", 1) == "afd-ffn1"
    assert trace_prefix("attention", 0, "decode-b8") == "afd-attention0-decode-b8"
    assert set(profiling.RANGES) >= {FFN_COMPUTE}
