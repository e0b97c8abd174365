"""The attention side of the P2P protocol: announce steps, send hidden states, receive results.

Mixed into :class:`~afd_core.connectors.p2p_protocol.P2pProtocolConnector`, whose
members it uses (declared in :mod:`~afd_core.connectors.p2p_members`). Eager steps pack a
checked header with each message; graph steps go to :mod:`afd_core.connectors.p2p_graph`.
Importing this module imports no torch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from afd_core.connectors.p2p_members import ProtocolMembers
from afd_core.connectors.p2p_wire import (
    HEADER_BYTES,
    TAG_A2F,
    TAG_CONTROL,
    TAG_F2A,
    a2f_header,
    check_received,
    describe_rank,
    encode_control_frame,
    f2a_header,
    header_differences,
)
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.metadata import ControlPayload, TransferHeader

if TYPE_CHECKING:
    import torch


class AttentionSideMixin(ProtocolMembers):
    """``send_step`` (through the control plane), ``send_hidden`` and ``recv_output``."""

    _send_hidden_headerless: Any  # graph steps (p2p_graph.GraphStepsMixin)
    _recv_output_headerless: Any

    def _send_step(self, payload: ControlPayload) -> None:
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        if self.config.role != "attention":
            raise RuntimeError(f"{self.name}: send_step is for the attention role")
        if payload.sender_rank != self.role_rank:
            raise AFDProtocolError(
                f"AFD control: attention rank {self.role_rank} was asked to send a payload "
                f"signed by attention rank {payload.sender_rank}"
            )
        tokens = payload.tokens_of(self.role_rank)
        if self._announced is not None and self._exchanges != self._expected_exchanges:
            step_id, stages = self._announced
            exc = AFDProtocolError(
                f"AFD: attention rank {self.role_rank} starts step {payload.step_id} after "
                f"{self._exchanges} layer exchanges in step {step_id}, expected "
                f"{self._expected_exchanges} ({self.wire.num_exchange_layers} layers x "
                f"{len(stages)} stages, none for a graph replay); every forward must "
                "exchange at every layer and stage"
            )
            self._fail(exc)
            raise exc
        frame = self._control_frame
        self._write_bytes(frame.data_ptr(), encode_control_frame(payload))
        deadline = time.monotonic() + self._timeout_s
        try:
            handle = self._post_send(frame, self._ffn_world, TAG_CONTROL)
            self._wait(
                handle, self._ffn_world, deadline, f"the control payload of step {payload.step_id}"
            )
        except AFDError as exc:
            self._fail(exc)
            raise
        self._announced = (payload.step_id, tokens)
        self._exchanges = 0
        self._graph_step = payload.is_graph_step
        replayed = payload.is_graph_step and not payload.is_graph_capturing
        self._expected_exchanges = 0 if replayed else len(tokens) * self.wire.num_exchange_layers

    def _reject_header(self, header: TransferHeader, direction: str) -> None:
        """Raise AFDProtocolError explaining why ``header`` cannot be exchanged now."""
        if self._announced is None or header.step_id != self._announced[0]:
            raise AFDProtocolError(
                f"AFD: attention rank {self.role_rank} exchanges step {header.step_id} but "
                f"announced step {self._announced[0] if self._announced else None}; call "
                "control_plane.send_step() first"
            )
        stages = self._announced[1]
        if not 0 <= header.stage < len(stages):
            raise AFDProtocolError(
                f"AFD: stage {header.stage} is outside step {header.step_id}'s "
                f"{len(stages)} stage(s)"
            )
        n = stages[header.stage]
        if direction == "a2f":
            expected = a2f_header(
                header.step_id, header.layer, header.stage, n, self.role_rank, self.wire
            )
            diffs = header_differences(header, expected)
        else:
            diffs = [f"num_tokens={header.num_tokens} (expected {n})"]
        raise AFDProtocolError(
            f"AFD: attention rank {self.role_rank} was given a header that differs from what "
            f"it announced for step {header.step_id} stage {header.stage} and from the wire "
            f"spec: {'; '.join(diffs)}"
        )

    def send_hidden(
        self,
        header: TransferHeader,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None = None,
    ) -> None:
        """Pack ``header``, ``hidden`` and ``router_logits`` into one message and send it.

        The header must match the token count announced for its stage and the wire spec,
        so that the FFN rank expects exactly this many bytes (AFDProtocolError
        otherwise); ``router_logits`` is required exactly when the wire spec has router
        logits. Posts the receive of the reply and the send (in the order
        ``_recv_reply_first`` says) and returns; the matching :meth:`recv_output`
        completes both.
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        wire, announced, stage = self.wire, self._announced, header.stage
        width = wire.logits_width_at(header.layer)
        if (
            announced is None
            or header.step_id != announced[0]
            or header.direction != "a2f"
            or not 0 <= stage < len(announced[1])
            or header.num_tokens != announced[1][stage]
            or header.sender_rank != self.role_rank
            or header.dtype != wire.dtype
            or header.hidden_size != wire.hidden_size
            or header.logits_width != width
            or (width and header.logits_dtype != wire.router_logits_dtype)
        ):
            self._reject_header(header, "a2f")
        n = header.num_tokens
        if hidden.shape != (n, wire.hidden_size) or hidden.dtype != self._dtype:
            self._reject_rows("hidden", hidden, n, wire.hidden_size, self._dtype)
        if (router_logits is None) != (width == 0):
            raise AFDProtocolError(
                f"AFD: router_logits {'missing' if router_logits is None else 'given'} for "
                f"layer {header.layer}, whose wire spec has {width} router-logit columns; "
                "compute_gate_on_attention decides whether the attention role sends router "
                "logits, and dense layers never do"
            )
        if router_logits is not None and (
            router_logits.shape != (n, width) or router_logits.dtype != self._logits_dtype
        ):
            self._reject_rows("router_logits", router_logits, n, width, self._logits_dtype)
        if stage in self._inflight:
            raise AFDProtocolError(
                f"AFD: attention rank {self.role_rank} sends layer {header.layer} stage {stage} "
                "while the previous exchange of that stage awaits recv_output()"
            )
        if self._graph_step:
            self._send_hidden_headerless(header, hidden, router_logits)
            return
        key, reply_key = ("a2f", stage), ("f2a", stage)
        slot = self._slots.get(key)
        if slot is None or slot.rows != n or (slot.logits_nbytes > 0) != (width > 0):
            slot = self._buffers.slot(key, n, width > 0)
        reply = self._slots.get(reply_key)
        if reply is None or reply.rows != n:
            reply = self._buffers.slot(reply_key, n, False)
        try:
            # The reply's receive goes first where the transport allows it (see
            # _recv_reply_first), so the FFN rank never waits for it.
            received = None
            if self._recv_reply_first:
                received = self._post_recv(reply.buf, self._ffn_world, TAG_F2A)
            self._write_bytes(
                slot.addr, self._headers.a2f(header.step_id, header.layer, stage, n, self.role_rank)
            )
            if n:
                slot.hidden.copy_(hidden)
                if router_logits is not None:
                    self._buffers.pack_logits(slot, router_logits)
            sent = self._post_send(slot.buf, self._ffn_world, TAG_A2F)
            if received is None:
                received = self._post_recv(reply.buf, self._ffn_world, TAG_F2A)
        except AFDError as exc:
            self._fail(exc)
            raise
        self._inflight[stage] = (sent, received, reply, header.layer, header.step_id)

    def recv_output(self, header: TransferHeader, out: torch.Tensor) -> torch.Tensor:
        """Receive the FFN result for ``header``'s step, layer and stage into ``out``.

        ``header`` may be the header of the matching :meth:`send_hidden` (only its step,
        layer, stage and token count are used). The received header is checked against
        the expected f2a header; a mismatch raises AFDProtocolError naming both views.
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        announced, stage = self._announced, header.stage
        if (
            announced is None
            or header.step_id != announced[0]
            or not 0 <= stage < len(announced[1])
            or header.num_tokens != announced[1][stage]
        ):
            self._reject_header(header, "f2a")
        n, layer = header.num_tokens, header.layer
        if out.shape != (n, self.wire.hidden_size) or out.dtype != self._dtype:
            self._reject_rows("out", out, n, self.wire.hidden_size, self._dtype)
        inflight = self._inflight.pop(stage, None)
        if inflight is None or inflight[3:] != (layer, header.step_id):
            sent_what = (
                "nothing for that stage"
                if inflight is None
                else f"layer {inflight[3]} of step {inflight[4]}"
            )
            exc = AFDProtocolError(
                f"AFD: attention rank {self.role_rank} asks for the result of layer {layer} "
                f"stage {stage} of step {header.step_id}, but sent {sent_what}; call "
                "send_hidden() and recv_output() in pairs"
            )
            if inflight is not None:  # its receive stays posted: the stream is lost
                self._fail(exc)
            raise exc
        sent, received, slot = inflight[:3]
        if self._graph_step:
            return self._recv_output_headerless(header, sent, out)
        deadline = time.monotonic() + self._timeout_s
        what = (layer, header.step_id)
        try:
            self._wait(sent, self._ffn_world, deadline, what)
            self._wait(received, self._ffn_world, deadline, what)
            if self._read_bytes(slot.addr, HEADER_BYTES) != self._headers.f2a(
                header.step_id, layer, stage, n, self._ffn_rank
            ):
                check_received(
                    self._read_bytes(slot.addr, HEADER_BYTES),
                    f2a_header(header.step_id, layer, stage, n, self._ffn_rank, self.wire),
                    describe_rank(self.topology, "ffn", self._ffn_rank),
                )
        except AFDError as exc:
            self._fail(exc)
            raise
        if n:
            out.copy_(slot.hidden)
        self._exchanges += 1
        return out
