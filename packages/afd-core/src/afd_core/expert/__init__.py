"""The expert-routed M:N exchange: routed experts split over the FFN ranks in blocks.

* :mod:`~afd_core.expert.placement`: which FFN rank holds which experts (pure);
* :mod:`~afd_core.expert.routing`: rows per FFN rank, local expert ids, the combine;
* :mod:`~afd_core.expert.messages`: the packed body of an attention-to-FFN message;
* :mod:`~afd_core.expert.attention` and :mod:`~afd_core.expert.ffn`: the endpoints.

:func:`open_expert` assembles a connector's parts: the control channel (attention ranks
announce steps to FFN rank 0, whose :class:`~afd_core.control.relay.StepRelay` forwards
them to the other FFN ranks) and the endpoint, over any data transport. This is the seam
for other dispatch/combine backends: a DeepEP or NVSHMEM backend would provide its own
endpoint pair with the same contract (afd-connectors-gpu's ``DeepEPM2NAFDConnector``
composes these point-to-point endpoints today).
"""

from __future__ import annotations

from afd_core.connector import Connector, ConnectorParts
from afd_core.control.channel import ControlInbox, ControlSender
from afd_core.control.relay import LEADER_WORLD_RANK, StepRelay
from afd_core.endpoint_context import EndpointContext
from afd_core.expert.attention import ExpertAttentionEndpoint
from afd_core.expert.ffn import ExpertFFNEndpoint
from afd_core.expert.messages import check_packable
from afd_core.expert.placement import ExpertPlacement
from afd_core.p2p.links import BlockLinks, shared_links
from afd_core.world import DataTransportFactory, World, open_world

#: Seconds ``close()`` waits for each control receiver thread to end.
JOIN_TIMEOUT_S = 2.0


def open_expert(connector: Connector, data: DataTransportFactory) -> ConnectorParts:
    """Rendezvous and build ``connector``'s expert-routed parts (see the module docstring)."""
    check_packable(connector.wire)
    world = open_world(connector, data)
    try:
        return assemble_expert(connector, world)
    except BaseException:
        world.interrupt()
        world.release()
        raise


def assemble_expert(connector: Connector, world: World) -> ConnectorParts:
    """``connector``'s expert-routed parts on an open ``world``.

    FFN rank 0 starts its control receiver threads here. The parts' shutdown interrupts
    the world, joins those threads, then releases the world.
    """
    config, topology, fuse, wire = (
        connector.config,
        connector.topology,
        connector.fuse,
        connector.wire,
    )
    placement = ExpertPlacement(wire.num_experts, topology.num_ffn_ranks)
    context = EndpointContext.of(connector, world)
    ffn_world = tuple(topology.world_rank("ffn", f) for f in range(topology.num_ffn_ranks))
    if config.role == "attention":
        sender = ControlSender(
            world.control, (LEADER_WORLD_RANK,), world.timeout_s, fuse, world.failures
        )
        endpoint = ExpertAttentionEndpoint(
            context, placement=placement, ffn_world_ranks=ffn_world, control=sender
        )
        return ConnectorParts(endpoint, (world.interrupt, world.release))
    senders = {a: topology.world_rank("attention", a) for a in range(topology.num_attention_ranks)}
    inbox = None
    if connector.role_rank == 0:
        links = BlockLinks(0, shared_links(world, senders))
        inbox = ControlInbox(links, fuse, "afd-control-f0")
        inbox.start()
        world.boundary_waiters.append(inbox.wake)
    relay = StepRelay(
        world.control,
        topology.num_attention_ranks,
        inbox,
        ffn_world[1:] if inbox is not None else (),
        world.timeout_s,
        fuse,
        world.failures,
    )
    ffn_endpoint = ExpertFFNEndpoint(
        context, block=placement.block(connector.role_rank), senders=senders, relay=relay
    )
    stop_inbox = (lambda: inbox.stop(JOIN_TIMEOUT_S)) if inbox is not None else (lambda: None)
    return ConnectorParts(ffn_endpoint, (world.interrupt, stop_inbox, world.release))
