"""Tiny connector classes and specs for config tests (no torch, nothing to run).

Only ``parse_extra_config`` matters here; the data-plane methods stay abstract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from afd_core.assembly import Control, ExpertRouted, P2pBlock, Pattern
from afd_core.config.coercion import to_int
from afd_core.connector import Connector
from afd_core.errors import AFDConfigError
from afd_core.plugins.specs import ConnectorSpec

_MODULE = __name__


@dataclass(frozen=True)
class FakeExtra:
    """The one ``connector_extra_config`` field FakeConnector accepts."""

    depth: int = 1


class FakeConnector(Connector):
    """Accepts ``connector_extra_config = {"depth": int}``."""

    name = "FakeP2P"
    pattern_type = P2pBlock

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> FakeExtra:
        unknown = sorted(set(raw) - {"depth"})
        if unknown:
            raise AFDConfigError(
                f"AFD config: connector_extra_config has unknown fields {unknown} for "
                f"{cls.name}; it accepts only depth"
            )
        return FakeExtra(depth=to_int("connector_extra_config.depth", raw.get("depth", 1)))


class PlainConnector(Connector):
    """Keeps the base class's ``parse_extra_config`` (accepts only ``{}``)."""

    name = "FakePlain"
    pattern_type = P2pBlock


class SloppyConnector(Connector):
    """A third-party style parser that raises a plain multi-line ValueError."""

    name = "FakeSloppy"
    pattern_type = P2pBlock

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> None:
        if raw:
            raise ValueError("bad extra config\nsecond line")


class NotAConnector:
    """Registered by mistake: not a Connector subclass."""


class NoPatternConnector(Connector):
    """A plugin bug: a connector class that names no pattern_type."""

    name = "FakeNoPattern"


class InBandPattern(Pattern):
    """A pattern without announced steps (only its class facts are read)."""

    name: ClassVar[str] = "in-band"
    controls = (Control.IN_BAND,)


class _GateOnFFN(Pattern):
    """A block pattern whose messages carry no routing."""

    name: ClassVar[str] = "hidden states only"
    gate_on_attention = False
    gate_reason = "moves hidden states only"


class AsyncConnector(FakeConnector):
    """FakeConnector's extra config on a pattern without announced steps."""

    name = "FakeAsync"
    pattern_type = InBandPattern


class ExpertConnector(PlainConnector):
    """The expert-routed pattern."""

    name = "FakeExpert"
    pattern_type = ExpertRouted


class GateOnFFNConnector(PlainConnector):
    """A pattern that needs the gate on the FFN role."""

    name = "FakeGateOnFFN"
    pattern_type = _GateOnFFN


CONNECTORS: Mapping[str, ConnectorSpec] = {
    "FakeP2P": ConnectorSpec("FakeP2P", f"{_MODULE}:FakeConnector", ("cpu",)),
    "FakeAsync": ConnectorSpec("FakeAsync", f"{_MODULE}:AsyncConnector", ("npu",)),
    "FakePlain": ConnectorSpec("FakePlain", f"{_MODULE}:PlainConnector", ("cpu",)),
    "FakeExpert": ConnectorSpec("FakeExpert", f"{_MODULE}:ExpertConnector", ("cpu",)),
    "FakeGateOnFFN": ConnectorSpec("FakeGateOnFFN", f"{_MODULE}:GateOnFFNConnector", ("cpu",)),
    "FakeSloppy": ConnectorSpec("FakeSloppy", f"{_MODULE}:SloppyConnector", ("cpu",)),
    "FakeNotAConnector": ConnectorSpec("FakeNotAConnector", f"{_MODULE}:NotAConnector", ("cpu",)),
    "FakeNoPattern": ConnectorSpec("FakeNoPattern", f"{_MODULE}:NoPatternConnector", ("cpu",)),
    "FakeUninstalled": ConnectorSpec(
        "FakeUninstalled", "afd_not_installed_anywhere.connector:Gone", ("cpu",)
    ),
}
