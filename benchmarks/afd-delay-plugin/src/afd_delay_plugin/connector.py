"""``DelayedGlooP2pConnector``: the reference P2P recipe over a delaying gloo data plane.

Links per attention rank, steps announced by the attention ranks, afd-core's gloo data
plane wrapped in :class:`~afd_delay_plugin.delaying.DelayingTransport`, the P2P block
pattern. ``connector_extra_config`` takes ``delay_us`` (a non-negative integer, default
0): how long each data message is held before it is sent; or ``delay_file``: the path of
a :class:`~afd_delay_plugin.delaying.DelaySetting` file whose value (microseconds) every
send reads, so that the delay of running servers can change. The control channel (step
announcements) is not delayed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from afd_core.assembly import (
    P2P_BLOCK,
    Control,
    Layout,
    P2pBlock,
    Recipe,
    TransportPlane,
    TransportSite,
    gloo_data_plane,
)
from afd_core.config.coercion import reject_unknown_fields
from afd_core.connector import Connector
from afd_core.errors import AFDConfigError
from afd_delay_plugin.delaying import DelayingTransport, DelaySetting

if TYPE_CHECKING:
    from afd_core.dataplane.transport import Transport


@dataclass(frozen=True)
class DelayExtra:
    """The parsed ``connector_extra_config``: ``delay_us`` microseconds per data message,
    or the ``delay_file`` that holds the delay."""

    delay_us: int = 0
    delay_file: str | None = None


class DelayedGlooP2pConnector(Connector):
    """Links, announced steps, a gloo data plane that holds every message, P2P block."""

    name = "DelayedGlooP2pConnector"
    pattern_type = P2pBlock

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> DelayExtra:
        """Accept ``delay_us`` (a non-negative integer) or ``delay_file`` (a path); name
        any other field."""
        reject_unknown_fields(raw, ("delay_us", "delay_file"), cls.name)
        delay, path = raw.get("delay_us", 0), raw.get("delay_file")
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise AFDConfigError(
                f"AFD: connector_extra_config.delay_us of {cls.name} must be a "
                f"non-negative integer (microseconds), not {delay!r}"
            )
        if path is not None and (not isinstance(path, str) or delay):
            raise AFDConfigError(
                f"AFD: connector_extra_config.delay_file of {cls.name} must be a path, "
                "given without delay_us"
            )
        return DelayExtra(delay, path)

    def recipe(self) -> Recipe:
        """The reference P2P recipe with the delaying data plane."""
        gloo, extra = gloo_data_plane(), self.extra

        def delayed(site: TransportSite) -> Transport:
            fixed = extra.delay_us * 1e-6
            delay_s: Callable[[], float] = lambda: fixed  # noqa: E731
            if extra.delay_file is not None:
                delay_s = DelaySetting(Path(extra.delay_file)).seconds
            return DelayingTransport(gloo.open(site), delay_s, site.timeout_s)

        return Recipe(Layout.LINKS, Control.ANNOUNCED, TransportPlane(delayed), P2P_BLOCK)
