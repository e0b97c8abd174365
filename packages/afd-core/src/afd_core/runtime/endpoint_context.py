"""What the role endpoints of one connector share.

Every endpoint (:mod:`afd_core.runtime.p2p`, :mod:`afd_core.runtime.expert`) is built on
the same few things from its connector and world: the wire spec, its role rank, the data
transport, the connector's fuse, the way peers are named in errors, and the AFD timeout.
They travel together as one :class:`EndpointContext` (the assembler builds it).
The pairing of an attention endpoint's sends and results is the contract's
:class:`~afd_core.in_flight.InFlight`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from afd_core.connector import WireSpec
    from afd_core.failures import Fuse, PeerFailures
    from afd_core.transport import Transport


@dataclass(frozen=True)
class EndpointContext:
    """The parts of a connector every one of its role endpoints uses."""

    wire: WireSpec
    role_rank: int
    transport: Transport
    fuse: Fuse
    failures: PeerFailures
    timeout_s: float
