"""What the role endpoints of one transport-plane connector share: :class:`EndpointContext`.

Every endpoint of a pattern on a transport plane (afd-core's P2P and expert-routed ones,
and a third party's) is built on the same few things from its connector and world: the
wire spec, its role rank, the data transport, the connector's fuse, the way peers are
named in errors, and the AFD timeout. The assembler builds them into one
:class:`EndpointContext` and hands it to the pattern
(:meth:`afd_core.assembly.AttentionSide.transport_context`). The pairing of an attention
endpoint's sends and results is :class:`~afd_core.kit.in_flight.InFlight`; an FFN
endpoint's links are :mod:`afd_core.kit.peer_links`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from afd_core.connector import WireSpec
    from afd_core.dataplane.transport import Transport
    from afd_core.failures import Fuse, PeerFailures


@dataclass(frozen=True)
class EndpointContext:
    """The parts of a connector every one of its role endpoints uses."""

    wire: WireSpec
    role_rank: int
    transport: Transport
    fuse: Fuse
    failures: PeerFailures
    timeout_s: float
