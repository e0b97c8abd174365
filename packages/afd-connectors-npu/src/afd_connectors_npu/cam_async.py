"""The CAM async pattern: expert-routed dispatch and combine, no control plane.

Pairing: every attention rank exchanges with every FFN rank; FFN rank ``f`` holds the
routed experts ``f * epr .. (f + 1) * epr - 1`` (``epr = ceil(E / F)``, the placement
rule of the CAM ops, :class:`~afd_core.placement.ExpertPlacement` ``rule="ceil"``). The
gate, the router and the shared experts run on the attention role; only the routed
experts run on the FFN role. Nothing is announced: each dispatch carries its layer and
counts, so the FFN side serves *work items* (:class:`~afd_core.connector.FFNWorkEndpoint`)
and the attention ranks step independently (``async_dp``).

* attention, per MoE layer and stage: :meth:`CamAsyncAttentionEndpoint.send` dispatches
  (``afd_async_dispatch_send`` on the stage's group; the op returns at once) and queues
  the routing on the stage's FIFO; :meth:`~CamAsyncAttentionEndpoint.recv`, the deferred
  receive, pops the FIFO and combines (``afd_async_combine_recv``: every FFN rank's
  unweighted expert rows, weighted with the router weights and summed per token in
  float32, rounded once). The step driver calls it after the send's checkpoint: with two
  stages, when the stage has the turn again, i.e. at the top of its next layer.
* FFN, per lane (one per stage group, each on its own thread): ``afd_async_dispatch_recv``
  returns the next dispatch of any attention rank, expanded to one row per (token, local
  expert); the FFN rank runs each row through its one expert with weight 1 and returns
  the rows unweighted (``afd_async_combine_send``). **Invariant:** the FFN side never
  applies a router weight; the attention side applies them all, in the combine.

Every message is checked (sequence numbers, layer, counts; a mispaired call raises
AFDProtocolError naming both sides), every wait but the FFN's idle one is bounded by the
AFD timeout, a lost peer fails the connector through afd-core's peer watch, and closing
wakes an FFN lane blocked in its receive. Importing this module imports no torch.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ClassVar

from afd_connectors_npu.cam_async_ops import CamAsyncOps
from afd_connectors_npu.op_calls import call_op
from afd_core.assembly import AttentionSide, Control, FFNSide, OpPlane, Pattern
from afd_core.connector import (
    AttentionEndpoint,
    ExpertRouting,
    FFNWorkEndpoint,
    FFNWorkItem,
)
from afd_core.errors import AFDConfigError, AFDProtocolError
from afd_core.failures import Fuse, guarded, guarded_until_closed, layer_of_step
from afd_core.kit.in_flight import InFlight
from afd_core.kit.step_exchanges import StepExchanges
from afd_core.placement import ExpertPlacement

if TYPE_CHECKING:
    import torch

    from afd_core.assembly import RuntimeSpec
    from afd_core.wire.metadata import ControlPayload


class CamAsync(Pattern):
    """The CAM async pattern (see the module docstring)."""

    name: ClassVar[str] = "CAM async"
    expert_placement = "ceil"
    gate_on_attention = True
    gate_reason = (
        "dispatches each token to the FFN ranks of its routed experts, so the gate and "
        "router run on the attention role"
    )
    data_plane = OpPlane
    controls = (Control.IN_BAND,)

    def check(self, spec: RuntimeSpec) -> None:
        """AFDConfigError unless the wire spec routes experts and bounds the batch."""
        wire = spec.wire
        if wire.num_experts < 1 or wire.top_k < 1 or not wire.router_logits_width:
            raise AFDConfigError(
                f"AFD {spec.name}: the model must route tokens to experts with the gate on "
                f"the attention role (num_experts={wire.num_experts}, top_k={wire.top_k}); "
                'serve a MoE model with "compute_gate_on_attention": true'
            )
        if wire.max_num_batched_tokens < 1:
            raise AFDConfigError(
                f"AFD {spec.name}: the wire spec carries no max_num_batched_tokens, which "
                "sizes the ops' buffers; build the connector through the role workers"
            )
        placement(spec)

    def attention_endpoint(self, side: AttentionSide) -> CamAsyncAttentionEndpoint:
        return CamAsyncAttentionEndpoint(side.spec, ops_of(side.spec), side.op_groups)

    def ffn_endpoint(self, side: FFNSide) -> CamAsyncFFNEndpoint:
        return CamAsyncFFNEndpoint(side.spec, ops_of(side.spec), side.op_groups)


def placement(spec: RuntimeSpec) -> ExpertPlacement:
    """The CAM rule's expert blocks of ``spec``'s deployment (AFDConfigError when its last
    FFN rank would hold no expert)."""
    return ExpertPlacement(
        spec.wire.num_experts, spec.topology.num_ffn_ranks, CamAsync.expert_placement
    )


def ops_of(spec: RuntimeSpec) -> CamAsyncOps:
    """The op call sites of ``spec``'s rank."""
    topology, wire = spec.topology, spec.wire
    return CamAsyncOps(
        spec.role_rank, topology.num_ffn_ranks, topology.num_attention_ranks,
        placement(spec).per_rank, wire.top_k, wire.hidden_size, wire.max_num_batched_tokens,
    )  # fmt: skip


class CamAsyncAttentionEndpoint(AttentionEndpoint):
    """Attention side of CAM async: dispatch per send, the deferred combine per recv."""

    def __init__(self, spec: RuntimeSpec, ops: CamAsyncOps, groups: tuple[str, ...]) -> None:
        self._spec, self._ops, self._groups = spec, ops, groups
        self._fuse: Fuse = spec.fuse
        self._exchanges = StepExchanges(
            spec.wire.exchange_layers, f"attention rank {spec.role_rank}"
        )
        self._owner_block = placement(spec).per_rank
        self._step_id = -1
        self._tokens: tuple[int, ...] = ()
        #: Per stage, the dispatches awaiting their combine: (layer, routing), oldest first.
        #: Each stage's dispatches awaiting their combine, in order (deferred receives).
        self._combines: InFlight[ExpertRouting] = InFlight(
            "AFD CAM async", spec.role_rank, depth=None
        )
        self._layer_index = {layer: i for i, layer in enumerate(spec.wire.exchange_layers)}
        #: Counters kept on the routing's device (no host read per layer): expanded rows
        #: (token, expert pairs) dispatched ``[FFN rank, layer index]``, tokens ``[layer]``.
        self._dispatched_rows: torch.Tensor | None = None
        self._dispatched_tokens = [0] * len(self._layer_index)
        self._anchor: torch.Tensor | None = None  # combine's output dtype

    @guarded
    def begin_step(self, payload: ControlPayload) -> None:
        """Start ``payload``'s step (nothing is announced); AFDProtocolError while the last
        one is unfinished or for more stages than the connector has groups."""
        tokens = self._exchanges.begin_announced(payload, self._spec.role_rank)
        if len(tokens) > len(self._groups):
            raise AFDProtocolError(
                f"AFD CAM async: step {payload.step_id} has {len(tokens)} stages, the "
                f"connector opened op groups for {len(self._groups)}"
            )
        self._step_id, self._tokens = payload.step_id, tokens

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
        """Dispatch ``hidden`` (this stage's tokens) with their routing; the combine waits
        in the stage's FIFO for :meth:`recv`."""
        self._exchanges.take(layer, stage)  # every layer, every stage, once, in order
        if routing is None or router_logits is not None:
            raise AFDProtocolError(
                "AFD CAM async: send each MoE layer's routing (topk_ids, topk_weights) and "
                "no router logits: the gate and router run on the attention role"
            )
        if hidden.shape[0] != self._tokens[stage]:
            raise AFDProtocolError(
                f"AFD CAM async: step {self._step_id} has {self._tokens[stage]} tokens in "
                f"stage {stage}, layer {layer} sends {hidden.shape[0]}"
            )
        import torch

        ids = routing.topk_ids.to(torch.int32).contiguous()
        call_op(
            self._fuse, layer_of_step(layer, self._step_id), self._ops.dispatch, hidden, ids,
            layer, self._groups[stage],
        )  # fmt: skip
        self._combines.put(layer, stage, ExpertRouting(ids, routing.topk_weights.float()))
        self._count(layer, ids, hidden.shape[0])

    def _count(self, layer: int, ids: torch.Tensor, tokens: int) -> None:
        """Add a dispatch to the counters (on the routing's device: no host read)."""
        import torch

        ffn_ranks = self._spec.topology.num_ffn_ranks
        if self._dispatched_rows is None:
            shape = (ffn_ranks, len(self._layer_index))
            self._dispatched_rows = torch.zeros(shape, dtype=torch.int64, device=ids.device)
        owners = ids.reshape(-1).long() // self._owner_block
        index = self._layer_index[layer]
        self._dispatched_rows[:, index] += torch.bincount(owners, minlength=ffn_ranks)
        self._dispatched_tokens[index] += tokens

    @guarded
    def recv(self, layer: int, stage: int) -> torch.Tensor:
        """The deferred receive: the combined routed-expert output of ``layer``'s dispatch
        in ``stage`` (the oldest one of the stage's FIFO)."""
        import torch

        routing = self._combines.take(layer, stage)
        if self._anchor is None:
            self._anchor = torch.empty(1, dtype=getattr(torch, self._spec.wire.dtype))
        result: torch.Tensor = call_op(
            self._fuse, layer_of_step(layer, self._step_id), self._ops.combine, self._anchor,
            routing.topk_ids, routing.topk_weights, self._groups[stage],
        )  # fmt: skip
        self._exchanges.finish()
        return result

    def stats(self) -> dict[str, Any]:
        """``dispatched_rows``: by FFN rank, by layer, the (token, expert) pairs sent;
        ``dispatched_tokens``: by layer, the tokens dispatched."""
        sent = [] if self._dispatched_rows is None else self._dispatched_rows.tolist()
        return {
            "dispatched_rows": {
                str(f): {str(layer): by_layer[i] for layer, i in self._layer_index.items()}
                for f, by_layer in enumerate(sent)
            },
            "dispatched_tokens": {
                str(layer): self._dispatched_tokens[i] for layer, i in self._layer_index.items()
            },
        }


class CamAsyncFFNEndpoint(FFNWorkEndpoint):
    """FFN side of CAM async: a lane per stage group; each work item is one dispatch."""

    def __init__(self, spec: RuntimeSpec, ops: CamAsyncOps, groups: tuple[str, ...]) -> None:
        self._spec, self._ops, self._groups = spec, ops, groups
        self._fuse: Fuse = spec.fuse
        self._block = placement(spec).block(spec.role_rank)
        self._layers = spec.wire.exchange_layers
        self._lock = threading.Lock()
        #: (attention rank, lane) -> index in ``_layers`` of the next layer it may send.
        self._next_layer: dict[tuple[int, int], int] = {}
        self._received_rows: dict[int, int] = {}
        self._work_items = 0
        self._tokens = 0

    @property
    def num_lanes(self) -> int:
        """One lane per stage group."""
        return len(self._groups)

    @guarded_until_closed
    def next_work(self, lane: int) -> FFNWorkItem | None:
        """The next dispatch of any attention rank on ``lane``'s group, as a work item
        (local expert ids, weight 1 per row); None once closed."""
        import torch

        dtype = getattr(torch, self._spec.wire.dtype)
        group = self._groups[lane]
        expanded, info, counts = call_op(
            self._fuse, f"the next dispatch on lane {lane}", self._ops.receive, dtype, group
        )
        tokens, attention_rank, layer, rows = (int(v) for v in info[:4].tolist())
        self._check_order(attention_rank, lane, layer)
        if counts.numel() < len(self._block) or int(counts[len(self._block) :].sum()):
            raise AFDProtocolError(
                f"AFD CAM async: attention rank {attention_rank} routed rows to experts FFN "
                f"rank {self._spec.role_rank} does not hold (it holds {len(self._block)}); "
                "both roles must serve the same model with the same num_ffn_ranks"
            )
        local = torch.repeat_interleave(torch.arange(counts.numel(), dtype=torch.int32), counts)
        routing = ExpertRouting(local.unsqueeze(1), torch.ones((rows, 1), dtype=torch.float32))
        with self._lock:
            self._received_rows[layer] = self._received_rows.get(layer, 0) + rows
            self._work_items += 1
            self._tokens += tokens
        return FFNWorkItem(attention_rank, layer, lane, expanded[:rows], routing, handle=info)

    @guarded
    def send_work(self, item: FFNWorkItem, output: torch.Tensor) -> None:
        """Return ``output`` (the unweighted expert rows) to the item's attention rank."""
        doing = f"the combine of layer {item.layer} for attention rank {item.attention_rank}"
        call_op(self._fuse, doing, self._ops.answer, output, item.handle, self._groups[item.lane])

    def _check_order(self, attention_rank: int, lane: int, layer: int) -> None:
        """AFDProtocolError unless ``layer`` is the next MoE layer of that rank's stage."""
        key = (attention_rank, lane)
        index = self._next_layer.get(key, 0)
        if layer != self._layers[index]:
            raise AFDProtocolError(
                f"AFD CAM async: attention rank {attention_rank} dispatched layer {layer} on "
                f"lane {lane} where its layer {self._layers[index]} was due (MoE layers "
                f"{self._layers}, each once per step and stage, in order)"
            )
        self._next_layer[key] = (index + 1) % len(self._layers)

    def stats(self) -> dict[str, Any]:
        """``expert_block`` [start, stop) of the experts held, ``received_rows`` by layer
        (expanded rows), ``work_items`` and ``tokens`` (tokens received, summed over the
        dispatches: a token counts once per layer)."""
        with self._lock:
            return {
                "expert_block": [self._block.start, self._block.stop],
                "received_rows": {str(k): v for k, v in self._received_rows.items()},
                "work_items": self._work_items,
                "tokens": self._tokens,
            }
