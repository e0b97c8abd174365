"""``P2pFFNEndpoint``: the FFN side of the P2P exchange, over any transport.

An FFN rank serves a contiguous block of attention ranks (:mod:`afd_core.topology`). It
takes each step from its :class:`~afd_core.control.channel.ControlInbox`; per layer and
stage it receives every taking-part rank's header message and hidden states straight
into its rows of one concatenated input tensor (no concatenation copy), and sends each
rank its rows of the output, slices of the output tensor itself (no copy).

Per step the endpoint lays out a :class:`_StepPlan` once: each rank's rows, its headers
(written for the whole step, see :mod:`afd_core.p2p.headers`) and the stage's input
tensors, which are reused from step to step while the shapes fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from afd_core.connector import FFNEndpoint, FFNLayerBatch, FFNStep
from afd_core.control.channel import ControlInbox
from afd_core.endpoint_context import EndpointContext
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.failures import guarded, guarded_until_closed, layer_of_step
from afd_core.graphs import ReplayGuard
from afd_core.p2p.headers import IncomingHeaders, OutgoingHeaders
from afd_core.transport import Transfer, TransferFailed
from afd_core.wire import HeaderCodec

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import torch


@dataclass(slots=True)
class _Member:
    """One attention rank of a step: where its rows go and its headers."""

    rank: int
    peer: int
    step_id: int
    rows: slice
    count: int
    incoming: IncomingHeaders
    outgoing: OutgoingHeaders
    hidden: torch.Tensor
    logits: torch.Tensor | None


@dataclass(slots=True)
class _StagePlan:
    """One stage of a step: its members, total rows and input tensors."""

    members: tuple[_Member, ...]
    total: int
    hidden: torch.Tensor
    logits: torch.Tensor | None
    splits: tuple[int, ...]


@dataclass(slots=True)
class _StepPlan:
    step: FFNStep
    stages: tuple[_StagePlan, ...]
    expected: int
    done: int = 0


class P2pFFNEndpoint(FFNEndpoint):
    """The FFN side of P2P (see the module docstring).

    ``senders`` maps the attention ranks of the block to their world ranks; ``replays``
    bounds the FFN rank's own graph replays (None: no graph steps).
    """

    def __init__(
        self,
        context: EndpointContext,
        *,
        senders: Mapping[int, int],
        inbox: ControlInbox,
        replays: ReplayGuard | None = None,
    ) -> None:
        import torch

        wire = context.wire
        self._wire, self._role_rank, self._transport = wire, context.role_rank, context.transport
        self._fuse, self._failures, self._timeout_s = (
            context.fuse, context.failures, context.timeout_s
        )  # fmt: skip
        self._senders = dict(senders)
        self._inbox = inbox
        self._replays = replays
        self._dtype = getattr(torch, wire.dtype)
        self._logits_dtype = getattr(torch, wire.router_logits_dtype)
        self._layers = wire.exchange_layers
        self._index = {layer: i for i, layer in enumerate(self._layers)}
        self._codec = HeaderCodec(wire)
        self._plan: _StepPlan | None = None
        # Reused from step to step: input tensors per stage, header blocks per rank.
        self._inputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._headers: dict[int, tuple[IncomingHeaders, OutgoingHeaders]] = {}

    @guarded_until_closed
    def next_step(self) -> FFNStep | None:
        return self._inbox.next_step()

    def recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            return self._recv(step, layer, stage)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    def _recv(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        plan = self._stage(step, layer, stage)
        if step.is_graph_step:
            raise AFDProtocolError(
                f"AFD: step {step.payloads[0].step_id} is a CUDA graph step; its messages carry "
                "no headers: use recv_into/send_from"
            )
        with_logits = self._wire.logits_width_at(layer) > 0
        row = stage * len(self._layers) + self._index[layer]
        transport = self._transport
        transfers = []
        try:
            for member in plan.members:
                peer = member.peer
                transfers.append(transport.post_recv(member.incoming.row(row), peer))
                if member.count:
                    transfers.append(transport.post_recv(member.hidden, peer))
                    if with_logits and member.logits is not None:
                        transfers.append(transport.post_recv(member.logits, peer))
            transport.wait_all(transfers, time.monotonic() + self._timeout_s)
        except TransferFailed as exc:
            raise self._failures.error(exc, self._doing(plan, exc, layer)) from None
        for member in plan.members:
            if member.incoming.checks_each_message:
                member.incoming.check(row)
        logits = plan.logits if with_logits else None
        return FFNLayerBatch(step, layer, stage, plan.hidden, plan.splits, logits)

    def send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        fuse = self._fuse
        if fuse.blown:
            raise fuse.error()
        try:
            self._send(batch, output)
        except AFDError as exc:
            fuse.blow(exc)
            raise

    def _send(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        step, layer, stage = batch.step, batch.layer, batch.stage
        plan = self._stage(step, layer, stage)
        if output.shape != (plan.total, self._wire.hidden_size) or output.dtype != self._dtype:
            self._reject_output(output, plan.total)
        transport = self._transport
        if output.device != transport.device:  # a CPU transport serving a device model
            output = output.to(transport.device)
        row = stage * len(self._layers) + self._index[layer]
        transfers = []
        try:
            for member in plan.members:
                transfers.append(transport.post_send(member.outgoing.row(row), member.peer))
                if member.count:
                    transfers.append(transport.post_send(output[member.rows], member.peer))
            transport.wait_all(transfers, time.monotonic() + self._timeout_s)
        except TransferFailed as exc:
            raise self._failures.error(exc, self._doing(plan, exc, layer)) from None
        self._finish_exchange(step)

    @guarded
    def recv_into(
        self,
        step: FFNStep,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
    ) -> None:
        plan = self._graph_stage(step, layer, stage)
        width = self._wire.logits_width_at(layer)
        self._check_graph_tensor("hidden", hidden, plan.total, self._wire.hidden_size)
        if (router_logits is None) != (width == 0):
            raise AFDProtocolError(
                f"AFD: layer {layer} has {width} router-logit columns on the wire; pass "
                "router_logits exactly when it has some"
            )
        if router_logits is not None:
            self._check_graph_tensor("router_logits", router_logits, plan.total, width)

        def post(member: _Member) -> list[Transfer]:
            targets = [hidden[member.rows]]
            if router_logits is not None:
                targets.append(router_logits[member.rows])
            return [self._transport.post_recv(t, member.peer) for t in targets]

        self._exchange_graph(plan, layer, post)

    @guarded
    def send_from(self, step: FFNStep, layer: int, stage: int, output: torch.Tensor) -> None:
        plan = self._graph_stage(step, layer, stage)
        self._check_graph_tensor("output", output, plan.total, self._wire.hidden_size)

        def post(member: _Member) -> list[Transfer]:
            return [self._transport.post_send(output[member.rows], member.peer)]

        self._exchange_graph(plan, layer, post)

    @guarded
    def wait_for_stream(self, what: str) -> None:
        if self._replays is None:
            super().wait_for_stream(what)
            return
        self._replays.wait_for_stream(what)

    # Step plans ------------------------------------------------------------------------

    def _stage(self, step: FFNStep, layer: int, stage: int) -> _StagePlan:
        """The plan of ``step``'s ``stage`` (made at the step's first call), checked."""
        if layer not in self._index:
            raise AFDProtocolError(
                f"AFD: layer {layer} is not an exchange layer of the wire spec {self._layers}"
            )
        if not 0 <= stage < step.num_stages:
            raise AFDProtocolError(
                f"AFD: stage {stage} is outside the step's {step.num_stages} stage(s)"
            )
        plan = self._plan
        if plan is None or plan.step is not step:
            plan = self._plan = self._make_plan(step)
        return plan.stages[stage]

    def _graph_stage(self, step: FFNStep, layer: int, stage: int) -> _StagePlan:
        if not step.is_graph_step:
            raise AFDProtocolError(
                f"AFD: step {step.payloads[0].step_id} is not a CUDA graph step; its messages "
                "carry headers: use recv/send"
            )
        return self._stage(step, layer, stage)

    def _make_plan(self, step: FFNStep) -> _StepPlan:
        previous = self._plan
        if previous is not None and previous.done != previous.expected:
            raise AFDProtocolError(
                f"AFD: FFN rank {self._role_rank} starts a new step after {previous.done} of "
                f"the {previous.expected} layer exchanges of the previous one"
            )
        stages = []
        rows_per_step = step.num_stages * len(self._layers)
        for stage in range(step.num_stages):
            counts = step.stage_tokens(stage)
            total = sum(counts)
            hidden, logits = self._stage_inputs(stage, total)
            hidden = hidden[:total]
            logits = None if logits is None else logits[:total]
            members, start = [], 0
            for rank, payload, n in zip(step.attention_ranks, step.payloads, counts, strict=True):
                incoming, outgoing = self._rank_headers(rank, rows_per_step)
                rows = slice(start, start + n)
                members.append(
                    _Member(rank, self._senders[rank], payload.step_id, rows, n, incoming, outgoing,
                            hidden[rows], None if logits is None else logits[rows])
                )  # fmt: skip
                start += n
            stages.append(_StagePlan(tuple(members), total, hidden, logits, counts))
        # Graph steps make no host calls per layer when replayed: nothing to count.
        plan = _StepPlan(step, tuple(stages), expected=0 if step.is_graph_step else rows_per_step)
        if not step.is_graph_step:
            self._write_headers(plan)
        return plan

    def _write_headers(self, plan: _StepPlan) -> None:
        """Every header of the step: expected from each rank, and sent back to it."""
        codec, layers = self._codec, self._layers
        for stage, stage_plan in enumerate(plan.stages):
            for member in stage_plan.members:
                n = member.count
                in_view, out_view = member.incoming.view, member.outgoing.view
                for i, layer in enumerate(layers):
                    offset = (stage * len(layers) + i) * 64
                    codec.pack_into(
                        in_view, offset, "a2f", member.step_id, layer, stage, n, member.rank,
                        logits_width=self._wire.logits_width_at(layer),
                    )  # fmt: skip
                    codec.pack_into(
                        out_view, offset, "f2a", member.step_id, layer, stage, n, self._role_rank
                    )
        for member in plan.stages[0].members:
            member.incoming.publish()
            member.outgoing.publish()

    def _stage_inputs(self, stage: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stage's input tensors, at least ``rows`` long (grown when too short)."""
        import torch

        inputs = self._inputs.get(stage)
        if inputs is None or inputs[0].shape[0] < rows:
            device, width = self._transport.device, self._wire.router_logits_width
            capacity = max(rows, 1)
            hidden = torch.empty(
                (capacity, self._wire.hidden_size), dtype=self._dtype, device=device
            )
            logits = None
            if width:
                logits = torch.empty((capacity, width), dtype=self._logits_dtype, device=device)
            inputs = self._inputs[stage] = (hidden, logits)
        return inputs

    def _rank_headers(self, rank: int, rows: int) -> tuple[IncomingHeaders, OutgoingHeaders]:
        headers = self._headers.get(rank)
        if headers is None or headers[1].rows < rows:
            sender = self._failures.describe(self._senders[rank])
            headers = (
                IncomingHeaders(self._transport, rows, sender),
                OutgoingHeaders(self._transport, rows),
            )
            self._headers[rank] = headers
        return headers

    # Transfers -------------------------------------------------------------------------

    def _exchange_graph(
        self, plan: _StagePlan, layer: int, post: Callable[[_Member], list[Transfer]]
    ) -> None:
        """Graph step: ``post(member)`` for every member, then wait for all (bounded)."""
        try:
            transfers = [t for m in plan.members for t in post(m)]
            self._transport.wait_all(transfers, time.monotonic() + self._timeout_s)
        except TransferFailed as exc:
            raise self._failures.error(exc, self._doing(plan, exc, layer)) from None

    @staticmethod
    def _doing(plan: _StagePlan, failure: TransferFailed, layer: int) -> str:
        """What a failed wait was for: the layer of the failed peer's step."""
        step_id = next((m.step_id for m in plan.members if m.peer == failure.peer), None)
        return layer_of_step(layer, plan.members[0].step_id if step_id is None else step_id)

    def _finish_exchange(self, step: FFNStep) -> None:
        """Count a finished (layer, stage); after the step's last, run deferred checks."""
        plan = self._plan
        assert plan is not None and plan.step is step
        plan.done += 1
        if plan.done != plan.expected or step.is_graph_step:
            return
        members = plan.stages[0].members
        if members[0].incoming.checks_each_message:
            return
        deadline = time.monotonic() + self._timeout_s
        try:
            self._transport.synchronize(deadline)
        except TransferFailed as exc:
            raise self._failures.error(exc, f"step {members[0].step_id}") from None
        for member in members:
            member.incoming.check_all(plan.expected)

    def _reject_output(self, output: torch.Tensor, rows: int) -> None:
        size = self._wire.hidden_size
        if output.shape != (rows, size) or output.dtype != self._dtype:
            raise AFDProtocolError(
                f"AFD: output is {tuple(output.shape)} {output.dtype}, the step and wire spec "
                f"say ({rows}, {size}) {self._dtype}"
            )

    @staticmethod
    def _check_graph_tensor(name: str, tensor: torch.Tensor, rows: int, cols: int) -> None:
        if tensor.shape != (rows, cols) or not tensor.is_contiguous():
            raise AFDProtocolError(
                f"AFD: {name} is {tuple(tensor.shape)}; the graph step needs a contiguous "
                f"({rows}, {cols}) tensor"
            )
