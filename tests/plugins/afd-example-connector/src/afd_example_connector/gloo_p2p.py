"""ExampleGlooP2pConnector: a connector that is only a recipe of afd-core's assembly API.

The recipe (:mod:`afd_core.assembly`): one world of every rank (``Layout.WORLD``), steps
announced by the attention ranks (``Control.ANNOUNCED``), afd-core's gloo data plane
wrapped in this package's :class:`~afd_example_connector.byte_counting.ByteCountingTransport`,
and the P2P block pattern (each FFN rank serves a contiguous block of attention ranks).
afd-core's assembler does the rest: rendezvous (FFN rank 0 hosts the store at
``config.host:config.port``), headers, bounded waits, peer liveness, shutdown.

``connector_extra_config`` takes one field, ``count_bytes`` (bool, default false):
count the bytes this rank posts on the data plane, in :attr:`byte_counts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
from afd_core.config.coercion import reject_unknown_fields, to_bool
from afd_core.connector import Connector
from afd_example_connector.byte_counting import ByteCountingTransport, ByteCounts

if TYPE_CHECKING:
    from afd_core.config import AFDConfig
    from afd_core.connector import WireSpec
    from afd_core.dataplane.transport import Transport


@dataclass(frozen=True)
class GlooP2pExtra:
    """The parsed ``connector_extra_config`` of ExampleGlooP2pConnector."""

    count_bytes: bool = False


class ExampleGlooP2pConnector(Connector):
    """One world, announced steps, gloo data plane (bytes counted on request), P2P block."""

    name = "ExampleGlooP2pConnector"
    pattern_type = P2pBlock

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        super().__init__(config, role_rank, wire)
        #: Bytes this rank posted on the data plane; None unless ``count_bytes``.
        self.byte_counts = ByteCounts() if self.extra.count_bytes else None

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> GlooP2pExtra:
        """Accept only ``count_bytes`` (true or false); name any other field."""
        reject_unknown_fields(raw, ("count_bytes",), cls.name)
        key = "connector_extra_config.count_bytes"
        return GlooP2pExtra(count_bytes=to_bool(key, raw.get("count_bytes", False)))

    def recipe(self) -> Recipe:
        """One world, announced steps, the (counted) gloo data plane, the P2P block pattern."""
        return Recipe(Layout.WORLD, Control.ANNOUNCED, self._data_plane(), P2P_BLOCK)

    def _data_plane(self) -> TransportPlane:
        gloo, counts = gloo_data_plane(), self.byte_counts
        if counts is None:
            return gloo

        def counted(site: TransportSite) -> Transport:
            return ByteCountingTransport(gloo.open(site), counts)

        return TransportPlane(counted)
