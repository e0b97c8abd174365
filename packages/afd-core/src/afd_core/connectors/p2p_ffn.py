"""The FFN side of the P2P protocol: receive a block's inputs, send the results back.

Mixed into :class:`~afd_core.connectors.p2p_protocol.P2pProtocolConnector`, whose
members it uses (declared in :mod:`~afd_core.connectors.p2p_members`). Importing this
module imports no torch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from afd_core.connector import FFNLayerBatch, FFNStep
from afd_core.connectors.p2p_members import ProtocolMembers
from afd_core.connectors.p2p_wire import (
    HEADER_BYTES,
    TAG_A2F,
    TAG_F2A,
    a2f_header,
    check_received,
    describe_rank,
    with_layer,
)
from afd_core.errors import AFDError, AFDProtocolError
from afd_core.metadata import TransferHeader

if TYPE_CHECKING:
    import torch


class BlockEntry:
    """FFN side: one attention rank of a step, for one stage."""

    __slots__ = ("header", "peer", "rank", "recv_key", "rows", "send_key", "step_id")

    def __init__(
        self, rank: int, peer: int, step_id: int, rows: int, stage: int, header: TransferHeader
    ) -> None:
        self.rank, self.peer, self.step_id, self.rows = rank, peer, step_id, rows
        self.recv_key, self.send_key = ("a2f", rank, stage), ("f2a", rank, stage)
        self.header = header  # layer 0; with_layer() gives the header of any layer


class FFNSideMixin(ProtocolMembers):
    """``recv_step`` (through the control plane), ``recv_hidden`` and ``send_output``."""

    is_closed: bool  # Connector's property

    def _recv_step(self) -> FFNStep | None:
        if self.is_closed:
            return None
        if self._failure is not None or self._torch is None:
            self._raise_unusable()
        if self.config.role != "ffn":
            raise RuntimeError(f"{self.name}: recv_step is for the FFN role")
        try:
            return self._inbox.next_step()
        except AFDError as exc:
            self._fail(exc)
            raise

    def _block_plan(self, step: FFNStep, stage: int) -> tuple[BlockEntry, ...]:
        """Per-rank facts of ``step`` and ``stage``, computed once for all its layers."""
        plan = self._plans.get(stage)
        if plan is not None and plan[0] is step:
            return plan[1]
        entries = tuple(
            BlockEntry(
                rank,
                self._attention_world[rank],
                payload.step_id,
                counts[stage],
                stage,
                a2f_header(payload.step_id, 0, stage, counts[stage], rank, self.wire),
            )
            for payload, rank, counts in zip(
                step.payloads, step.attention_ranks, step.tokens, strict=True
            )
        )
        self._plans[stage] = (step, entries)
        return entries

    def recv_hidden(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """Receive one layer's input from every attention rank of ``step``, concatenated.

        Each received header is checked (AFDProtocolError naming both views). With one
        attention rank the tensors are views of the receive buffer (no copy).
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        if not 0 <= stage < step.num_stages:
            raise AFDProtocolError(
                f"AFD: stage {stage} is outside the step's {step.num_stages} stage(s)"
            )
        with_logits = self.wire.logits_width_at(layer) > 0
        entries = self._block_plan(step, stage)
        deadline = time.monotonic() + self._timeout_s
        slots = []
        try:
            posted = []
            for entry in entries:
                slot = self._slots.get(entry.recv_key)
                if (
                    slot is None
                    or slot.rows != entry.rows
                    or (slot.logits_nbytes > 0) != with_logits
                ):
                    slot = self._buffers.slot(entry.recv_key, entry.rows, with_logits)
                slots.append(slot)
                posted.append(self._post_recv(slot.buf, entry.peer, TAG_A2F))
            for handle, slot, entry in zip(posted, slots, entries, strict=True):
                self._wait(handle, entry.peer, deadline, (layer, entry.step_id))
                raw = self._read_bytes(slot.addr, HEADER_BYTES)
                if raw != self._headers.a2f(entry.step_id, layer, stage, entry.rows, entry.rank):
                    check_received(
                        raw,
                        with_layer(entry.header, layer),
                        describe_rank(self.topology, "attention", entry.rank),
                    )
        except AFDError as exc:
            self._fail(exc)
            raise
        return FFNLayerBatch(
            step=step,
            layer=layer,
            stage=stage,
            hidden=self._buffers.concat(("cat", stage), [s.hidden for s in slots], self._dtype),
            router_logits=self._buffers.concat(
                ("catl", stage), [self._buffers.unpack_logits(s) for s in slots], self._logits_dtype
            )
            if with_logits
            else None,
            splits=tuple(e.rows for e in entries),
            headers=tuple(with_layer(e.header, layer) for e in entries),
        )

    def send_output(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Split ``output`` by ``batch.splits`` and send each part to its attention rank.

        Returns once every part is sent (a closing FFN rank never drops a result).
        """
        if self._closed.is_set() or self._failure is not None or self._torch is None:
            self._raise_unusable()
        layer, stage = batch.layer, batch.stage
        entries = self._block_plan(batch.step, stage)
        rows = sum(e.rows for e in entries)
        if output.shape != (rows, self.wire.hidden_size) or output.dtype != self._dtype:
            self._reject_rows("output", output, rows, self.wire.hidden_size, self._dtype)
        deadline = time.monotonic() + self._timeout_s
        single = len(entries) == 1
        posted = []
        start = 0
        try:
            for entry in entries:
                n = entry.rows
                slot = self._slots.get(entry.send_key)
                if slot is None or slot.rows != n:
                    slot = self._buffers.slot(entry.send_key, n, False)
                self._write_bytes(
                    slot.addr, self._headers.f2a(entry.step_id, layer, stage, n, self.role_rank)
                )
                if n:
                    slot.hidden.copy_(output if single else output[start : start + n])
                posted.append(self._post_send(slot.buf, entry.peer, TAG_F2A))
                start += n
            for handle, entry in zip(posted, entries, strict=True):
                self._wait(handle, entry.peer, deadline, (layer, entry.step_id))
        except AFDError as exc:
            self._fail(exc)
            raise
