"""What the role endpoints of one connector share, and the pairing rule of their calls.

Every endpoint (:mod:`afd_core.runtime.p2p`, :mod:`afd_core.runtime.expert`) is built on
the same few things from its connector and world: the wire spec, its role rank, the data
transport, the connector's fuse, the way peers are named in errors, and the AFD timeout.
They travel together as one :class:`EndpointContext` (the assembler builds it).
:func:`take_in_flight` is the pairing rule both attention endpoints apply to ``recv``:
one result per ``send``, same layer and stage (the rule of a step's exchanges is
:class:`~afd_core.step_exchanges.StepExchanges`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from afd_core.errors import AFDProtocolError

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


class _HasLayer(Protocol):
    layer: int


F = TypeVar("F", bound=_HasLayer)


def take_in_flight(in_flight: dict[int, F], layer: int, stage: int, role_rank: int) -> F:
    """Remove and return the exchange of ``stage`` that ``recv(layer, stage)`` completes.

    Raises AFDProtocolError when that stage has nothing in flight or another layer.
    """
    exchange = in_flight.pop(stage, None)
    if exchange is None or exchange.layer != layer:
        sent = "nothing" if exchange is None else f"layer {exchange.layer}"
        raise AFDProtocolError(
            f"AFD: attention rank {role_rank} asks for the result of layer {layer} "
            f"stage {stage}, but sent {sent} for that stage; call send() and recv() in pairs"
        )
    return exchange
