"""CUDA graph steps of the P2P protocol: header-less data messages on fixed buffers.

In a graph step (``ControlPayload.is_graph_step``) the attention rank's forward is a CUDA
graph. Python runs its exchanges once, while the graph is captured (no data flows then:
the FFN rank captures its side at the same time); each replay repeats the device work
with no host code, so nothing per layer can be written or checked on the host. Instead:

* the step's control payload, sent by the runner before every replay, is checked by
  the FFN rank as for any step (step id in sequence, token counts, graph flag);
* each data message is the bare tensor, sent from and received into the tensors the
  caller passes (their addresses are what the graph records): hidden states, then
  router logits when the layer has them (a2f); the output rows (f2a). Sizes follow from
  the announced token counts and the wire spec, as in eager steps.

The transport primitives must be capturable when the current stream is capturing
(``_wait`` then only joins the transfer's stream, without polling). Mixed into
:class:`~afd_core.connectors.p2p_protocol.P2pProtocolConnector`, whose members it uses
(declared in :mod:`~afd_core.connectors.p2p_members`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from afd_core.connectors.p2p_members import ProtocolMembers
from afd_core.connectors.p2p_wire import TAG_A2F, TAG_F2A
from afd_core.errors import AFDError, AFDProtocolError

if TYPE_CHECKING:
    import torch

    from afd_core.connector import FFNStep
    from afd_core.metadata import TransferHeader


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of the contiguous ``tensor`` (same memory)."""
    import torch

    return tensor.reshape(-1).view(torch.uint8)


class GraphStepsMixin(ProtocolMembers):
    """Header-less exchanges of graph steps (see the module docstring)."""

    _block_plan: Any  # the FFN side's (p2p_ffn.FFNSideMixin)

    # Attention side --------------------------------------------------------------------

    def _send_hidden_headerless(
        self, header: TransferHeader, hidden: torch.Tensor, router_logits: torch.Tensor | None
    ) -> None:
        """Post the sends of ``hidden`` (and ``router_logits``) of an already checked header."""
        peer = self._ffn_world
        try:
            sent = [self._post_send(as_bytes(hidden), peer, TAG_A2F)]
            if router_logits is not None:
                logits = as_bytes(router_logits.contiguous())
                sent.append(self._post_send(logits, peer, TAG_A2F))
        except AFDError as exc:
            self._fail(exc)
            raise
        self._inflight[header.stage] = (
            tuple(sent),
            None,
            None,
            header.layer,
            header.step_id,
        )

    def _recv_output_headerless(
        self, header: TransferHeader, sent: tuple[Any, ...], out: torch.Tensor
    ) -> torch.Tensor:
        """Receive the reply straight into ``out`` (posted after the sends: NCCL order)."""
        peer = self._ffn_world
        deadline = time.monotonic() + self._timeout_s
        what = (header.layer, header.step_id)
        try:
            received = self._post_recv(as_bytes(out), peer, TAG_F2A)
            for handle in (*sent, received):
                self._wait(handle, peer, deadline, what)
        except AFDError as exc:
            self._fail(exc)
            raise
        self._exchanges += 1
        return out

    # FFN side --------------------------------------------------------------------------

    def _check_graph_rows(
        self, step: FFNStep, layer: int, stage: int, name: str, tensor: Any, width: int
    ) -> None:
        if not step.is_graph_step:
            raise AFDProtocolError(
                f"AFD: step {step.payloads[0].step_id} is not a CUDA graph step; its messages "
                "carry headers: use recv_hidden/send_output"
            )
        rows = sum(step.stage_tokens(stage))
        if tensor.shape != (rows, width) or not tensor.is_contiguous():
            raise AFDProtocolError(
                f"AFD: {name} of layer {layer} stage {stage} is {tuple(tensor.shape)}; the "
                f"step needs a contiguous ({rows}, {width}) tensor"
            )

    def recv_hidden_into(
        self,
        step: FFNStep,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
    ) -> None:
        """See :meth:`afd_core.connector.Connector.recv_hidden_into`."""
        if self._closed.is_set() or self._failure is not None:
            self._raise_unusable()
        wire = self.wire
        width = wire.logits_width_at(layer)
        self._check_graph_rows(step, layer, stage, "hidden", hidden, wire.hidden_size)
        if (router_logits is None) != (width == 0):
            raise AFDProtocolError(
                f"AFD: layer {layer} has {width} router-logit columns on the wire; pass "
                "router_logits exactly when it has some"
            )
        if router_logits is not None:
            self._check_graph_rows(step, layer, stage, "router_logits", router_logits, width)

        def post(entry: Any, rows: slice) -> list[Any]:
            handles = [self._post_recv(as_bytes(hidden[rows]), entry.peer, TAG_A2F)]
            if router_logits is not None:
                handles.append(self._post_recv(as_bytes(router_logits[rows]), entry.peer, TAG_A2F))
            return handles

        self._exchange_rows(step, layer, stage, post)

    def send_output_from(self, step: FFNStep, layer: int, stage: int, output: torch.Tensor) -> None:
        """See :meth:`afd_core.connector.Connector.send_output_from`."""
        if self._closed.is_set() or self._failure is not None:
            self._raise_unusable()
        self._check_graph_rows(step, layer, stage, "output", output, self.wire.hidden_size)

        def post(entry: Any, rows: slice) -> list[Any]:
            return [self._post_send(as_bytes(output[rows]), entry.peer, TAG_F2A)]

        self._exchange_rows(step, layer, stage, post)

    def _exchange_rows(
        self, step: FFNStep, layer: int, stage: int, post: Callable[[Any, slice], list[Any]]
    ) -> None:
        """``post(entry, rows)`` for each rank of the step (its rows of the block), then
        wait for every handle posted, within the AFD timeout; a failure fails the connector.
        """
        deadline = time.monotonic() + self._timeout_s
        try:
            posted, start = [], 0
            for entry in self._block_plan(step, stage):
                rows = slice(start, start + entry.rows)
                posted += [(handle, entry) for handle in post(entry, rows)]
                start += entry.rows
            for handle, entry in posted:
                self._wait(handle, entry.peer, deadline, (layer, entry.step_id))
        except AFDError as exc:
            self._fail(exc)
            raise
