"""Hardware profiles: presets load, documents round-trip, and a bad profile is an
AFDConfigError that names the key and what to write instead."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_core.errors import AFDConfigError
from afd_core.plan.model_shape import model_shape_from_config
from afd_core.plan.profile import load_profile, parse_profile, preset_names, profile_document
from tests.unit.plan.conftest import measured_profile, tiny_config

GOOD = profile_document(load_profile("h100"))


def test_every_preset_loads_and_states_its_source():
    assert {"h100", "h200", "ascend-910b", "cpu-core"} <= set(preset_names())
    for name in preset_names():
        assert len(load_profile(name).source) > 40, name


def test_a_measured_profile_round_trips_through_its_json_document():
    profile = measured_profile(model_shape_from_config(tiny_config("tiny-deepseek-v2")))
    document = json.loads(json.dumps(profile_document(profile)))
    assert parse_profile(document) == profile


def test_a_profile_file_is_read_by_path(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(GOOD))
    assert load_profile(str(path)) == load_profile("h100")


positive = st.floats(min_value=1e-9, max_value=1e18, allow_nan=False, allow_infinity=False)


@settings(max_examples=50, deadline=None)
@given(flops=positive, hbm=positive, memory=positive, link=positive, fraction=st.floats(0.01, 1))
def test_any_valid_roofline_round_trips(flops, hbm, memory, link, fraction):
    document = copy.deepcopy(GOOD)
    document["device"] |= {
        "peak_bf16_flops_per_s": flops,
        "hbm_bytes_per_s": hbm,
        "memory_bytes": memory,
        "flops_efficiency": fraction,
    }
    document["link"]["bytes_per_s"] = link
    profile = parse_profile(document)
    assert parse_profile(profile_document(profile)) == profile


def _with(path: tuple[str, ...], value):
    document = copy.deepcopy(GOOD)
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is _DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


_DROP = object()
MEASURED = profile_document(
    measured_profile(model_shape_from_config(tiny_config("tiny-qwen3-moe")))
)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (_with(("schema",), "other"), "schema must be 'afd-hardware-profile'"),
        (_with(("version",), 3), "version 3 is not supported"),
        (_with(("device", "peak_bf16_flops_pr_s"), 1.0), "unknown key 'peak_bf16_flops_pr_s'"),
        (_with(("device", "hbm_bytes_per_s"), -1), "hbm_bytes_per_s is -1"),
        (_with(("device", "memory_bytes"), True), "memory_bytes is True"),
        (_with(("device", "memory_bytes"), _DROP), "memory_bytes is missing"),
        (_with(("device", "flops_efficiency"), 1.5), "must be in (0, 1]"),
        (_with(("link",), [1]), "link must be a JSON object"),
        (_with(("name",), ""), "name must be a non-empty string"),
        ({**MEASURED, "measured": {**MEASURED["measured"], "threads": 0}}, "threads is 0"),
        (
            {
                **MEASURED,
                "measured": {
                    **MEASURED["measured"],
                    "moe": {"tokens": [4, 1], "seconds": [1e-4, 2e-4]},
                },
            },
            "increasing order",
        ),
        (
            {
                **MEASURED,
                "measured": {
                    **MEASURED["measured"],
                    "step_overhead": {"batches": [1, 2], "seconds": [1e-3]},
                },
            },
            "must be 2 positive numbers",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_bad_profile_is_an_error_naming_the_key(document, expected):
    with pytest.raises(AFDConfigError) as info:
        parse_profile(document, "p.json")
    assert expected in str(info.value)


def test_an_unknown_profile_name_lists_the_presets():
    with pytest.raises(AFDConfigError, match="h100"):
        load_profile("no-such-gpu")


SERVED = {
    **MEASURED,
    "measured": {
        **MEASURED["measured"],
        "serving_overhead": {"batches": [1, 16], "seconds": [1e-3, 4e-3]},
    },
}


def test_a_measured_serving_overhead_round_trips_and_is_interpolated_by_batch():
    profile = parse_profile(SERVED)
    assert profile.measured is not None and profile.measured.serving_overhead is not None
    assert profile.measured.serving_overhead(16) == pytest.approx(4e-3)
    assert profile.measured.serving_overhead(4) == pytest.approx(1e-3 + 3e-3 * 3 / 15)
    assert profile_document(profile)["version"] == 2
    assert parse_profile(profile_document(profile)) == profile


def test_a_version_1_profile_is_still_read_but_cannot_hold_a_serving_overhead():
    assert parse_profile({**MEASURED, "version": 1}).measured.serving_overhead is None
    with pytest.raises(AFDConfigError, match="serving_overhead needs version 2"):
        parse_profile({**SERVED, "version": 1}, "p.json")


def test_a_bad_serving_overhead_is_an_error_naming_it():
    bad = copy.deepcopy(SERVED)
    bad["measured"]["serving_overhead"]["seconds"] = [1e-3, -1.0]
    with pytest.raises(AFDConfigError, match="serving_overhead: seconds"):
        parse_profile(bad, "p.json")
