"""One registered group of the CPU reference kernels: ``a2e`` / ``e2a`` over a transport.

A :class:`ReferenceGroup` is what ``group_ep`` names: one stage's transport over the
whole AFD world (FFN ranks first), the world's rank map and the AFD timeout, and the
state the calls on it share. The rules (the README states them for users):

* Pairing: each FFN rank serves the **contiguous** block of attention ranks that
  :meth:`afd_core.topology.Topology.block_of` gives it (not the prior art's strided
  rule); ``rank < expert_rank_size`` is an FFN rank.
* Attention ``a2e`` sends a header and its ``x`` rows (with ``compute_gate``: also its
  expert ids and scales) to its FFN rank and returns at once; the send stays pending in
  this group and is completed by the next call with that peer (at the latest the
  matching ``e2a``). Attention ``e2a`` receives exactly the rows it sent, as a new tensor.
* FFN ``a2e`` receives the header of every block member taking part first, checks them
  and the sum of their row counts against ``batch_size``, then receives the rows into
  ``expand_x`` (block order); the per-source counts come back in ``atten_batch_size``.
  Who takes part (ours; the prior art's kernel waits for the whole block): with
  ``expert_ids`` given on the FFN side it is int32, one entry per block member, the
  rows expected from it or -1 for a member that takes no part in this call (an
  attention server with no step at the moment); without it, every member. A member
  that takes no part has -1 in ``atten_batch_size``. FFN ``e2a`` splits ``expand_x`` by
  those counts and sends each member that took part its rows; the sends stay pending
  like the attention side's.
* Every message carries a :class:`~afd_ascend_ops.header.OpsHeader` whose ``seq``
  is the sender's call number on this group with that peer (a2e and e2a alternate, so
  both sides count alike); a receiver that finds anything but what it expects raises
  AFDProtocolError naming both views. A receiver checks the headers before it waits
  for its own earlier sends, so a mispaired peer is reported as such, not as a timeout.
* Every call waits until one deadline, ``timeout_s`` after it starts; a lost peer or
  that deadline raises AFDPeerError naming the peer and the call, :meth:`interrupt`
  makes a blocked call (and every later one) raise AFDShutdown. After any AFD error the
  group refuses every later call with the same error: its message stream can no longer
  be trusted.

Calls on one group run one at a time (a lock); :meth:`interrupt` and :meth:`close` may
run on any thread.
"""

from __future__ import annotations

import threading
import time

import torch

from afd_ascend_ops.header import OpsHeader
from afd_ascend_ops.reference.arguments import check_positive, wire_dtype
from afd_ascend_ops.reference.bodies import (
    ROUTING_ENTRY_BYTES,
    WIRE_TORCH_DTYPES,
    routing_as_bytes,
    routing_from_bytes,
    rows_as_bytes,
)
from afd_ascend_ops.schemas import blocks_per_ffn_rank
from afd_core.errors import AFDConfigError, AFDProtocolError
from afd_core.failures import guarded
from afd_core.kit.channel import MessageChannel
from afd_core.kit.pairing import BLOCK

#: The end of a mispaired message's error.
MISPAIRED = (
    "The two roles' calls are mispaired (a call skipped or repeated, other rows than the "
    "FFN rank expects, or different hidden_size, dtype or routing arguments): call a2e and "
    "e2a once per layer and stage on both roles, with the same model and row counts"
)


class ReferenceGroup:
    """The group one ``group_ep`` name stands for (see the module docstring).

    ``channel`` carries its messages over the world (built with :data:`MISPAIRED`);
    every call is bounded by the channel's ``timeout_s``. The group owns the channel and
    its transport: :meth:`close` closes them.
    """

    def __init__(self, channel: MessageChannel[OpsHeader]) -> None:
        self._channel = channel
        self._fuse = channel.fuse
        self._lock = threading.Lock()
        self._sent_rows: int | None = None  # attention: rows of the a2e awaiting its e2a

    @property
    def name(self) -> str:
        """The ``group_ep`` / ``group_name`` the ops are called with."""
        return self._channel.name

    # -- life cycle ------------------------------------------------------------------

    def interrupt(self) -> None:
        """Make a blocked call raise AFDShutdown now, and every later call (idempotent)."""
        self._channel.interrupt()

    def close(self) -> None:
        """Interrupt, release the transport and drop the pending sends (idempotent)."""
        self._channel.close_under(self._lock)

    # -- the ops ---------------------------------------------------------------------

    @guarded
    def a2e(
        self,
        x: torch.Tensor,
        expert_ids: torch.Tensor | None,
        scales: torch.Tensor | None,
        batch_size: int,
        hidden_size: int,
        topk: int,
        expert_rank_size: int,
        attention_rank_size: int,
        rank: int,
        compute_gate: int,
    ) -> list[torch.Tensor]:
        """The reference ``a2e`` (see the module docstring and the README)."""
        blocks = self._check_world("a2e", expert_rank_size, attention_rank_size, rank)
        dtype = wire_dtype("a2e", self.name, "x", x)
        check_positive("a2e", "hidden_size", hidden_size)
        gated = compute_gate != 0
        if gated:
            check_positive("a2e", "topk (with compute_gate=1)", topk)
        with self._lock:
            if self._channel.role == "attention":
                self._send_attention_rows(x, expert_ids, scales, hidden_size, topk, gated, dtype)
                return self._attention_a2e_outputs(x, blocks)
            expected = self._expected_rows(expert_ids)
            return self._receive_block_rows(
                x.dtype, batch_size, hidden_size, topk, gated, blocks, expected
            )

    @guarded
    def e2a(
        self,
        expand_x: torch.Tensor,
        atten_batch_size: torch.Tensor,
        batch_size: int,
        hidden_size: int,
        topk: int,
        expert_rank_size: int,
        attention_rank_size: int,
        rank: int,
    ) -> torch.Tensor:
        """The reference ``e2a`` (see the module docstring and the README)."""
        blocks = self._check_world("e2a", expert_rank_size, attention_rank_size, rank)
        dtype = wire_dtype("e2a", self.name, "expand_x", expand_x)
        check_positive("e2a", "hidden_size", hidden_size)
        with self._lock:
            if self._channel.role == "attention":
                return self._receive_result(expand_x, hidden_size, dtype)
            members = self._block_counts(atten_batch_size, blocks, expand_x, batch_size)
            self._send_block_results(expand_x, members, hidden_size, dtype)
            return torch.zeros((1, 1), dtype=expand_x.dtype)

    # -- attention side --------------------------------------------------------------

    def _send_attention_rows(
        self,
        x: torch.Tensor,
        expert_ids: torch.Tensor | None,
        scales: torch.Tensor | None,
        hidden_size: int,
        topk: int,
        gated: bool,
        dtype: str,
    ) -> None:
        if x.dim() != 2 or x.shape[1] != hidden_size:
            raise ValueError(
                f"afd_ascend::a2e on group {self.name!r}: x must be [rows, hidden_size="
                f"{hidden_size}], not {list(x.shape)}"
            )
        if self._sent_rows is not None:
            raise AFDProtocolError(
                f"afd_ascend::a2e on group {self.name!r}: {self._channel.me()} sends again before "
                "e2a received the result of its previous a2e on this group; call a2e and "
                "e2a in pairs, one pair per layer and stage"
            )
        rows = x.shape[0]
        body = [rows_as_bytes(x)]
        if gated:
            body.append(routing_as_bytes(expert_ids, scales, rows, topk, self.name))
        peer = self._ffn_peer()
        deadline = time.monotonic() + self._channel.timeout_s
        self._channel.finish_sends(peer, deadline)
        header = OpsHeader(
            "a2e",
            self._channel.next_call(peer),
            self._channel.world_rank,
            peer,
            rows,
            hidden_size,
            dtype,
            topk if gated else 0,
            gated,
        )
        self._channel.send(peer, header, [b for b in body if b.numel()])
        self._sent_rows = rows

    def _attention_a2e_outputs(self, x: torch.Tensor, blocks: int) -> list[torch.Tensor]:
        """The attention side's outputs: placeholders, and its own row count at its
        place in its FFN rank's block (what that FFN rank's ``atten_batch_size`` holds)."""
        counts = torch.zeros(blocks, dtype=torch.int32)
        block = self._channel.topology.block_of(
            self._channel.topology.ffn_rank_of(self._channel.role_rank)
        )
        counts[self._channel.role_rank - block.start] = x.shape[0]
        return [
            torch.zeros((1, 1), dtype=x.dtype),
            torch.zeros((1, 1), dtype=torch.int32),
            torch.zeros((1, 1), dtype=torch.float32),
            counts,
            torch.zeros(1, dtype=torch.bool),
        ]

    def _receive_result(self, expand_x: torch.Tensor, hidden_size: int, dtype: str) -> torch.Tensor:
        rows = self._sent_rows
        if rows is None:
            raise AFDProtocolError(
                f"afd_ascend::e2a on group {self.name!r}: {self._channel.me()} asks for a result "
                "but sent nothing with a2e on this group; call a2e and e2a in pairs"
            )
        if expand_x.dim() < 1 or expand_x.shape[0] != rows:
            raise AFDProtocolError(
                f"afd_ascend::e2a on group {self.name!r}: expand_x is "
                f"{list(expand_x.shape)}, but the matching a2e sent {rows} rows; pass a "
                "tensor with as many rows as that a2e's x"
            )
        peer = self._ffn_peer()
        deadline = time.monotonic() + self._channel.timeout_s
        seq = self._channel.next_call(peer)
        head = torch.empty(OpsHeader.SIZE, dtype=torch.uint8)
        head_recv = self._channel.post(peer, head, send=False)
        self._channel.wait(head_recv, deadline, f"e2a call {seq} on group {self.name!r}")
        expected = OpsHeader("e2a", seq, peer, self._channel.world_rank, rows, hidden_size, dtype)
        self._channel.check(head, expected)
        self._channel.finish_sends(peer, deadline)
        self._sent_rows = None
        out = torch.empty((rows, hidden_size), dtype=expand_x.dtype)
        if rows:
            body = self._channel.post(peer, out.view(torch.uint8), send=False)
            self._channel.wait(body, deadline, f"the rows of e2a call {seq} on group {self.name!r}")
        return out

    # -- FFN side --------------------------------------------------------------------

    def _expected_rows(self, expected: torch.Tensor | None) -> list[int | None]:
        """Per block member: the rows it must send (None: any), or -1 (takes no part)."""
        size = len(self._block_peers())
        if expected is None:
            return [None] * size
        values = expected.reshape(-1).tolist()
        if len(values) != size or any(v < -1 for v in values):
            raise ValueError(
                f"afd_ascend::a2e on group {self.name!r}: on an FFN rank, expert_ids gives "
                f"the rows expected from each of its {size} block members (-1: takes no "
                f"part), not {values}"
            )
        return [int(v) for v in values]

    def _receive_block_rows(
        self,
        torch_dtype: torch.dtype,
        batch_size: int,
        hidden_size: int,
        topk: int,
        gated: bool,
        blocks: int,
        expected_rows: list[int | None],
    ) -> list[torch.Tensor]:
        members = [
            (peer, rows)
            for peer, rows in zip(self._block_peers(), expected_rows, strict=True)
            if rows != -1
        ]
        peers = [peer for peer, _ in members]
        deadline = time.monotonic() + self._channel.timeout_s
        seqs = [self._channel.next_call(peer) for peer in peers]
        heads = [torch.empty(OpsHeader.SIZE, dtype=torch.uint8) for _ in peers]
        posted = [self._channel.post(p, h, send=False) for p, h in zip(peers, heads, strict=True)]
        dtype = WIRE_TORCH_DTYPES[torch_dtype]
        counts = []
        for (peer, rows), seq, head, transfer in zip(members, seqs, heads, posted, strict=True):
            self._channel.wait(transfer, deadline, f"a2e call {seq} on group {self.name!r}")
            expected = OpsHeader(
                "a2e",
                seq,
                peer,
                self._channel.world_rank,
                rows or 0,
                hidden_size,
                dtype,
                topk if gated else 0,
                gated,
            )
            counts.append(
                self._channel.check(head, expected, ignore=("rows",) if rows is None else ()).rows
            )
        if sum(counts) != batch_size:
            sources = ", ".join(
                f"{self._channel.describe(p)}: {n}" for p, n in zip(peers, counts, strict=True)
            )
            raise AFDProtocolError(
                f"afd_ascend::a2e on group {self.name!r}: the attention ranks of "
                f"{self._channel.me()}'s block sent {sum(counts)} rows ({sources}), but its a2e "
                f"expects batch_size={batch_size}; pass the sum of the block's token counts "
                "of this layer and stage"
            )
        for peer in peers:
            self._channel.finish_sends(peer, deadline)
        expand_x = torch.empty((batch_size, hidden_size), dtype=torch_dtype)
        routing = torch.empty((batch_size, topk * ROUTING_ENTRY_BYTES), dtype=torch.uint8)
        bodies = []
        start = 0
        for peer, rows in zip(peers, counts, strict=True):
            if rows:
                end = start + rows
                bodies.append(
                    self._channel.post(peer, expand_x[start:end].view(torch.uint8), send=False)
                )
                if gated:
                    bodies.append(self._channel.post(peer, routing[start:end], send=False))
                start = end
        for transfer in bodies:
            peer = self._channel.describe(transfer.peer)
            self._channel.wait(transfer, deadline, f"the a2e rows of {peer} on group {self.name!r}")
        ids, weights = routing_from_bytes(routing, batch_size, topk, gated)
        received = iter(counts)
        sizes = [-1 if rows == -1 else next(received) for rows in expected_rows]
        return [
            expand_x,
            ids,
            weights,
            torch.tensor(sizes + [0] * (blocks - len(sizes)), dtype=torch.int32),
            torch.ones(batch_size, dtype=torch.bool),
        ]

    def _block_counts(
        self, atten_batch_size: torch.Tensor, blocks: int, expand_x: torch.Tensor, batch_size: int
    ) -> list[tuple[int, int]]:
        """(peer, rows) of each block member that took part, from ``atten_batch_size``,
        checked against ``expand_x``."""
        values = atten_batch_size.reshape(-1).tolist()
        size = len(self._block_peers())
        if len(values) != blocks or any(values[size:]) or min(values, default=0) < -1:
            raise AFDProtocolError(
                f"afd_ascend::e2a on group {self.name!r}: atten_batch_size {values} is not "
                f"what a2e returned on {self._channel.me()} ({blocks} counts, the first {size} for "
                "its block (-1: took no part), the rest 0); pass output [3] of the matching "
                "a2e"
            )
        members = [
            (peer, rows)
            for peer, rows in zip(self._block_peers(), values[:size], strict=True)
            if rows != -1
        ]
        total = sum(rows for _, rows in members)
        rows = expand_x.shape[0] if expand_x.dim() == 2 else -1
        if not total == rows == batch_size:
            raise AFDProtocolError(
                f"afd_ascend::e2a on group {self.name!r}: expand_x is {list(expand_x.shape)}, "
                f"batch_size={batch_size} and atten_batch_size sums to {total}; "
                "they must agree (the rows a2e returned, one result row each)"
            )
        return members

    def _send_block_results(
        self, expand_x: torch.Tensor, members: list[tuple[int, int]], hidden_size: int, dtype: str
    ) -> None:
        if expand_x.shape[1] != hidden_size:
            raise ValueError(
                f"afd_ascend::e2a on group {self.name!r}: expand_x must be [rows, "
                f"hidden_size={hidden_size}], not {list(expand_x.shape)}"
            )
        out = rows_as_bytes(expand_x)
        deadline = time.monotonic() + self._channel.timeout_s
        start = 0
        for peer, rows in members:
            self._channel.finish_sends(peer, deadline)
            header = OpsHeader(
                "e2a",
                self._channel.next_call(peer),
                self._channel.world_rank,
                peer,
                rows,
                hidden_size,
                dtype,
            )
            self._channel.send(peer, header, [out[start : start + rows]] if rows else [])
            start += rows

    # -- shared parts ----------------------------------------------------------------

    def _check_world(self, op: str, ffn_ranks: int, attention_ranks: int, rank: int) -> int:
        """``ceil(A / F)`` once the op's world arguments match this group's world."""
        topology = self._channel.topology
        ours = (topology.num_ffn_ranks, topology.num_attention_ranks, self._channel.world_rank)
        if (ffn_ranks, attention_ranks, rank) != ours:
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: expert_rank_size={ffn_ranks}, "
                f"attention_rank_size={attention_ranks}, rank={rank}, but the group was "
                f"opened for {ours[0]} FFN ranks, {ours[1]} attention ranks and world rank "
                f"{ours[2]}; pass the world's facts (FFN ranks first)"
            )
        if topology.pairing != BLOCK:
            raise AFDConfigError(
                f"afd_ascend::{op} on group {self.name!r}: a2e/e2a pair ranks in blocks, "
                f"but this world uses the {topology.pairing.name!r} pairing"
            )
        return blocks_per_ffn_rank(attention_ranks, ffn_ranks)

    def _ffn_peer(self) -> int:
        return self._channel.topology.world_rank(
            "ffn", self._channel.topology.ffn_rank_of(self._channel.role_rank)
        )

    def _block_peers(self) -> list[int]:
        block = self._channel.topology.block_of(self._channel.role_rank)
        return [self._channel.topology.world_rank("attention", a) for a in block]
