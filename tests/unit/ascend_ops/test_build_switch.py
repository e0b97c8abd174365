"""The build switch's decision table (pure: the environment, PATH and directories injected)."""

from __future__ import annotations

import pytest

from afd_ascend_ops.build_switch import ENV, BuildSwitchError, decide

TOOLKIT = {"ASCEND_TOOLKIT_HOME": "/usr/local/Ascend/ascend-toolkit/latest"}


def tools(*present: str):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def is_dir(path: str) -> bool:
    return path == TOOLKIT["ASCEND_TOOLKIT_HOME"]


@pytest.mark.parametrize(
    ("switch", "toolkit", "found", "compiles"),
    [
        (None, False, (), False),  # the default on a CPU host: a pure wheel
        (None, True, ("bisheng", "msopgen"), True),  # unset in a CANN image: compile
        (None, True, ("bisheng",), False),  # an incomplete toolchain: pure wheel
        ("", True, ("bisheng", "msopgen"), True),
        ("0", True, ("bisheng", "msopgen"), False),  # off wins over a toolchain
        ("OFF", False, (), False),
        ("1", True, ("bisheng", "msopgen"), True),
        ("Yes", True, ("bisheng", "msopgen"), True),
    ],
)
def test_the_decision_table(switch, toolkit, found, compiles) -> None:
    env = dict(TOOLKIT) if toolkit else {}
    if switch is not None:
        env[ENV] = switch
    decision = decide(env, tools(*found), is_dir)
    assert decision.compile is compiles
    assert decision.reason


def test_asking_for_the_kernels_without_the_toolchain_names_what_is_missing() -> None:
    with pytest.raises(BuildSwitchError) as error:
        decide({ENV: "1", "ASCEND_HOME_PATH": "/nowhere"}, tools("bisheng"), is_dir)
    message = str(error.value)
    assert "ASCEND_HOME_PATH='/nowhere' is not a directory" in message
    assert "msopgen not on PATH" in message and "bisheng" not in message.split(":", 1)[1]


def test_an_unknown_value_is_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(BuildSwitchError, match=r"'maybe' is not one of 1, true, yes, on, 0"):
        decide({ENV: "maybe"}, tools(), is_dir)


def test_the_default_says_why_it_builds_a_pure_wheel() -> None:
    reason = decide({}, tools(), is_dir).reason
    assert reason.startswith(f"{ENV} unset and no CANN toolchain (no CANN toolkit")
