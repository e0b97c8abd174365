"""The CAM P2P pattern: the block pairing, with ``a2e``/``e2a`` moving the data.

Pairing: afd-core's block rule (:mod:`afd_core.topology`): FFN rank ``f`` serves the
contiguous block of attention ranks ``block_of(f)``; each attention rank announces its
steps to its FFN rank on afd-core's control channel. Per exchanging layer and stage:

* attention: ``send`` calls ``a2e`` as sender (its rows go to its FFN rank; the op
  returns at once), ``recv`` calls ``e2a`` as receiver (the FFN result of those rows);
* FFN (layer by layer, stage by stage): ``recv`` calls ``a2e`` as receiver with the
  rows expected from each attention rank of the step (from the announcements; -1 for a
  rank of the block that takes no part in the step) and gets the block's rows
  concatenated; ``send`` calls ``e2a`` as sender.

Each stage has its own op group (``side.op_groups[stage]``), so two stages in flight
never share a message stream. The ops check every message's header (a mispaired call
raises AFDProtocolError naming both sides), bound every wait by the AFD timeout, and
wake on the provider's interrupt; a lost peer fails the connector through afd-core's
peer watch. An op's error names the op call and its group; :func:`call_op` adds the
layer and step the rank was waiting for. The gate runs on the FFN role: router logits
never travel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from afd_connectors_npu.cam_ops import CamP2pOps
from afd_connectors_npu.op_calls import call_op
from afd_connectors_npu.providers import op_device
from afd_core.assembly import AttentionSide, FFNSide, OpPlane, Pattern, StepAnnouncer, StepSource
from afd_core.connector import (
    AttentionEndpoint,
    ExpertRouting,
    FFNEndpoint,
    FFNLayerBatch,
    FFNStep,
)
from afd_core.errors import AFDProtocolError
from afd_core.failures import Fuse, guarded, guarded_until_closed, layer_of_step
from afd_core.kit.in_flight import InFlight
from afd_core.kit.step_exchanges import StepExchanges

if TYPE_CHECKING:
    import torch

    from afd_core.assembly import RuntimeSpec
    from afd_core.wire.metadata import ControlPayload


class CamP2p(Pattern):
    """The CAM P2P pattern (see the module docstring); ``cores`` gives each role's
    ``aiv_num``."""

    name: ClassVar[str] = "CAM P2P"
    gate_on_attention = False
    gate_reason = (
        "moves hidden states only (its ops carry no routing), so the gate runs on the FFN role"
    )
    data_plane = OpPlane

    def __init__(self, cores: dict[str, int]) -> None:
        self._cores = cores

    def attention_endpoint(self, side: AttentionSide) -> CamP2pAttentionEndpoint:
        assert side.announcer is not None, "CAM P2P needs announced steps"
        return CamP2pAttentionEndpoint(side.spec, self._ops(side.spec), side.announcer,
                                       side.op_groups)  # fmt: skip

    def ffn_endpoint(self, side: FFNSide) -> CamP2pFFNEndpoint:
        assert side.steps is not None, "CAM P2P needs announced steps"
        return CamP2pFFNEndpoint(side.spec, self._ops(side.spec), side.steps, side.op_groups)

    def _ops(self, spec: RuntimeSpec) -> CamP2pOps:
        topology = spec.topology
        return CamP2pOps(
            spec.world_rank, topology.num_ffn_ranks, topology.num_attention_ranks,
            spec.wire.hidden_size, self._cores[spec.role], op_device(),
        )  # fmt: skip


class CamP2pAttentionEndpoint(AttentionEndpoint):
    """Attention side of CAM P2P: announce each step, ``a2e`` per send, ``e2a`` per recv."""

    def __init__(
        self,
        spec: RuntimeSpec,
        ops: CamP2pOps,
        announcer: StepAnnouncer,
        groups: tuple[str, ...],
    ) -> None:
        self._spec, self._ops, self._announcer, self._groups = spec, ops, announcer, groups
        self._fuse: Fuse = spec.fuse
        self._exchanges = StepExchanges(
            spec.wire.exchange_layers, f"attention rank {spec.role_rank}"
        )
        self._step_id = -1
        self._tokens: tuple[int, ...] = ()
        #: By stage: the rows sent and the atten_batch_size of their a2e.
        self._in_flight: InFlight[tuple[torch.Tensor, torch.Tensor]] = InFlight(
            "AFD CAM P2P", spec.role_rank
        )

    @guarded
    def begin_step(self, payload: ControlPayload) -> None:
        """Announce ``payload``'s step; AFDProtocolError while the last one is unfinished."""
        tokens = self._exchanges.begin_announced(payload, self._spec.role_rank)
        if len(tokens) > len(self._groups):
            raise AFDProtocolError(
                f"AFD CAM P2P: step {payload.step_id} has {len(tokens)} stages, the connector "
                f"opened op groups for {len(self._groups)}"
            )
        self._announcer.send(payload)
        self._step_id, self._tokens = payload.step_id, tokens
        self._in_flight.clear()

    @guarded
    def send(
        self,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        *,
        router_logits: torch.Tensor | None = None,
        routing: ExpertRouting | None = None,
    ) -> None:
        """``a2e`` of ``hidden`` (this stage's rows) to the FFN rank."""
        self._exchanges.take(layer, stage)  # every layer, every stage, once, in order
        if router_logits is not None or routing is not None:
            raise AFDProtocolError(
                "AFD CAM P2P: the gate runs on the FFN role; send no router logits or routing"
            )
        if hidden.shape[0] != self._tokens[stage]:
            raise AFDProtocolError(
                f"AFD CAM P2P: step {self._step_id} announced {self._tokens[stage]} tokens in "
                f"stage {stage}, layer {layer} sends {hidden.shape[0]}"
            )
        self._in_flight.check_free(layer, stage)
        doing = layer_of_step(layer, self._step_id)
        sizes = call_op(self._fuse, doing, self._ops.attention_send, hidden, self._groups[stage])
        self._in_flight.put(layer, stage, (hidden, sizes))

    @guarded
    def recv(self, layer: int, stage: int) -> torch.Tensor:
        """``e2a``: the FFN result of the rows this stage sent at ``layer``."""
        hidden, sizes = self._in_flight.take(layer, stage)
        doing = layer_of_step(layer, self._step_id)
        result = call_op(
            self._fuse, doing, self._ops.attention_receive, hidden, sizes, self._groups[stage]
        )
        self._exchanges.finish()
        return result


class CamP2pFFNEndpoint(FFNEndpoint):
    """FFN side of CAM P2P: the announced steps, ``a2e`` per recv, ``e2a`` per send."""

    def __init__(
        self, spec: RuntimeSpec, ops: CamP2pOps, steps: StepSource, groups: tuple[str, ...]
    ) -> None:
        self._spec, self._ops, self._steps, self._groups = spec, ops, steps, groups
        self._fuse: Fuse = spec.fuse
        self._block = tuple(spec.topology.block_of(spec.role_rank))
        self._exchanges = StepExchanges(spec.wire.exchange_layers, f"FFN rank {spec.role_rank}")
        #: Stage -> (layer, atten_batch_size of its a2e) until its send.
        self._received: dict[int, tuple[int, torch.Tensor]] = {}

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        """The next announced step (None once closed)."""
        step: FFNStep | None = self._steps.next_step()
        if step is not None and step.num_stages > len(self._groups):
            raise AFDProtocolError(
                f"AFD CAM P2P: step {step.payloads[0].step_id} has {step.num_stages} stages, "
                f"the connector opened op groups for {len(self._groups)}"
            )
        if step is not None:
            self._exchanges.begin(step.payloads[0].step_id, step.num_stages)
        self._received.clear()
        return step

    @guarded
    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """``a2e``: the rows of every attention rank of ``step`` in ``stage``."""
        import torch

        self._exchanges.take(layer, stage)
        splits = step.stage_tokens(stage)
        counts = dict(zip(step.attention_ranks, splits, strict=True))
        expected = [counts.get(a, -1) for a in self._block]
        dtype = getattr(torch, self._spec.wire.dtype)
        hidden, sizes = call_op(
            self._fuse, layer_of_ffn_step(layer, step), self._ops.ffn_receive, expected,
            sum(splits), dtype, self._groups[stage],
        )  # fmt: skip
        self._received[stage] = (layer, sizes)
        return FFNLayerBatch(step=step, layer=layer, stage=stage, hidden=hidden, splits=splits)

    @guarded
    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """``e2a``: each attention rank of the batch gets its rows of ``output``."""
        received = self._received.pop(batch.stage, None)
        if received is None or received[0] != batch.layer:
            raise AFDProtocolError(
                f"AFD CAM P2P: FFN rank {self._spec.role_rank} sends layer {batch.layer} stage "
                f"{batch.stage} without having received it; call recv() and send() in pairs"
            )
        call_op(
            self._fuse, layer_of_ffn_step(batch.layer, batch.step), self._ops.ffn_send, output,
            received[1], self._groups[batch.stage],
        )  # fmt: skip
        self._exchanges.finish()


def layer_of_ffn_step(layer: int, step: FFNStep) -> str:
    """What an FFN rank waits for at ``layer`` of ``step``: ``"layer 3 of step 17"``, or,
    where its attention ranks' step numbers differ, ``"layer 3 of step 17 of attention
    rank 0, step 4 of attention rank 1"``."""
    ids = {payload.step_id for payload in step.payloads}
    if len(ids) == 1:
        return layer_of_step(layer, ids.pop())
    steps = (
        f"step {p.step_id} of attention rank {rank}"
        for rank, p in zip(step.attention_ranks, step.payloads, strict=True)
    )
    return f"layer {layer} of {', '.join(steps)}"
