"""One registered group of the CAM async reference kernels: dispatch and combine over gloo.

An :class:`AsyncGroup` is what ``group_name`` names: one stage's transport over the whole
AFD world (FFN ranks first), the world's rank map and the AFD timeout. The rules (the
README states them for users; where they are ours and not the compiled kernels', it says
so):

* **Placement** (the compiled kernels' rule): FFN rank ``f`` holds the experts
  ``f * epr .. (f + 1) * epr - 1`` (``epr`` = ``route_expert_num_per_moe``), so an
  expert's owner is ``expert // epr``.
* **No control plane.** Attention ``dispatch_send`` sends *every* FFN rank a header (the
  layer, the token count, the top-k) and, when any of its tokens has an expert there, a
  body: those tokens' rows (ascending) and their global expert ids. An FFN rank with no
  token gets the header alone, and answers it: zero routed rows travel as header-only
  messages both ways, so every dispatch is answered by every FFN rank and a lost or
  repeated message shows as a sequence error, not as a hang.
* FFN ``dispatch_recv`` waits (as long as the attention ranks are idle) for the next
  dispatch of **any** attention rank on this group (an
  :class:`~afd_ascend_ops.reference.inbox.Inbox` reads each attention rank's messages as
  they come), and returns its rows expanded: one
  row per (token, local expert) pair, grouped by local expert ascending and, within an
  expert, by token ascending; ``counts[e]`` rows for local expert ``e``; ``batch_info``
  says who sent it (see :data:`BATCH_INFO`).
* FFN ``combine_send`` returns the first ``batch_info[3]`` rows of ``expand_x`` (one
  *unweighted* expert output per expanded row, in the expanded order) to the attention
  rank of ``batch_info``, in ``expand_x``'s dtype (bf16, or float32 for full-precision
  partials). It must answer a ``dispatch_recv`` of this group that is not answered yet.
* Attention ``combine_recv`` receives every FFN rank's answer to its last dispatch,
  places each row at its (token, slot) by the same order, weights it with
  ``expert_scales`` and sums each token's top-k slots in float32, in slot order,
  rounding once to ``expand_x``'s dtype.
* One dispatch in flight per attention rank and group: ``dispatch_send`` before the
  ``combine_recv`` of the previous one raises AFDProtocolError (a stage sends layer L+1
  only after it received layer L).
* Every message carries a :class:`~afd_ascend_ops.header.OpsHeader` (``seq``: the
  call number between the two ranks on this group; ``layer``: the dispatch's layer); a
  receiver that finds anything but what it expects raises AFDProtocolError naming both
  views. Every wait but the FFN's idle wait for the next dispatch ends by ``timeout_s``
  after the call starts; a lost peer raises AFDPeerError, :meth:`interrupt` makes a
  blocked call raise AFDShutdown, and after any AFD error the group refuses every later
  call with that error.

Calls on one group run one at a time (a lock); :meth:`interrupt` and :meth:`close` may
run on any thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from afd_ascend_ops.header import OpsHeader
from afd_ascend_ops.reference.arguments import check_positive, wire_dtype
from afd_ascend_ops.reference.bodies import TORCH_DTYPES, rows_as_bytes
from afd_ascend_ops.reference.inbox import Inbox
from afd_ascend_ops.schemas import BATCH_INFO_FIELDS, batch_info_size, dispatch_capacity
from afd_core.errors import AFDConfigError, AFDProtocolError
from afd_core.failures import guarded
from afd_core.kit.channel import MessageChannel

#: ``batch_info`` of ``dispatch_recv`` (int64), its first :data:`BATCH_INFO_FIELDS`
#: entries by index; then the tokens of each attention TP rank (the sender counts as TP
#: rank 0: afd's attention TP leader exchanges for its replica), then the rows of each
#: (local expert, TP rank).
BATCH_INFO = {"tokens": 0, "attention_rank": 1, "layer": 2, "rows": 3, "seq": 4}
assert len(BATCH_INFO) == BATCH_INFO_FIELDS

#: The end of a mispaired message's error.
MISPAIRED = (
    "The two roles' calls are mispaired (a call skipped or repeated, or different "
    "hidden_size, top_k, dtype or expert arguments): dispatch and combine once per MoE "
    "layer and stage on the attention rank, combine_send once per dispatch_recv on the "
    "FFN rank, with the same model on both roles"
)


@dataclass(frozen=True)
class _Dispatched:
    """An attention rank's dispatch awaiting its combine: layer, tokens, rows per FFN rank."""

    layer: int
    tokens: int
    expanded_rows: tuple[int, ...]


@dataclass(frozen=True)
class _Unanswered:
    """A dispatch an FFN rank received and has not answered yet."""

    seq: int
    layer: int
    rows: int


@dataclass(frozen=True)
class AsyncWorld:
    """The world arguments every CAM async op takes, checked against the group's."""

    moe_rank_num: int
    attn_rank_num: int
    route_expert_num_per_moe: int
    role_rank: int
    world_size: int
    tp_size: int


class AsyncGroup:
    """The group one CAM async ``group_name`` stands for (see the module docstring).

    ``channel`` carries its messages over the world (built with :data:`MISPAIRED`); its
    ``timeout_s`` bounds every wait but the FFN's idle one. The group owns the channel and
    its transport: :meth:`close` closes them.
    """

    def __init__(self, channel: MessageChannel[OpsHeader]) -> None:
        self._channel = channel
        self._fuse = channel.fuse
        self._lock = threading.Lock()
        self._dispatched: _Dispatched | None = None  # attention: awaiting its combine
        self._unanswered: dict[int, _Unanswered] = {}  # FFN: by attention world rank
        self._dispatches: Inbox | None = None  # FFN: every attention rank's dispatches

    @property
    def name(self) -> str:
        """The ``group_ep`` / ``group_name`` the ops are called with."""
        return self._channel.name

    # -- life cycle ------------------------------------------------------------------

    def interrupt(self) -> None:
        """Make a blocked call raise AFDShutdown now, and every later call (idempotent)."""
        self._channel.interrupt()
        inbox = self._dispatches
        if inbox is not None:
            inbox.close()

    def close(self) -> None:
        """Interrupt, release the transport and drop the pending sends (idempotent)."""
        self.interrupt()
        self._channel.close_under(self._lock)

    # -- attention side --------------------------------------------------------------

    @guarded
    def dispatch_send(
        self,
        x: torch.Tensor,
        expert_ids: torch.Tensor,
        world: AsyncWorld,
        max_seq_len: int,
        batch_size: int,
        hidden_size: int,
        top_k: int,
        layer_index: int,
        dynamic_quant: int,
    ) -> torch.Tensor:
        """The reference ``afd_async_dispatch_send`` (see the module docstring)."""
        op = "afd_async_dispatch_send"
        self._check_world(op, world, "attention")
        dtype = wire_dtype(op, self.name, "x", x)
        self._check_shapes(op, x, expert_ids, batch_size, hidden_size, top_k, world)
        _check_quant(op, dynamic_quant)
        capacity = max_seq_len // world.tp_size
        if batch_size > capacity:
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: batch_size={batch_size} exceeds "
                f"max_seq_len / tp_size = {capacity}; pass max_num_batched_tokens as "
                "max_seq_len (the same on both roles)"
            )
        with self._lock:
            if self._dispatched is not None:
                raise AFDProtocolError(
                    f"afd_ascend::{op} on group {self.name!r}: {self._channel.me()} dispatches "
                    f"layer {layer_index} before combine_recv received layer "
                    f"{self._dispatched.layer}; one dispatch per group may be in flight"
                )
            owners = expert_ids.long() // world.route_expert_num_per_moe
            ids = expert_ids.to(torch.int32).contiguous()
            deadline = time.monotonic() + self._channel.timeout_s
            expanded = []
            for ffn_rank in range(world.moe_rank_num):
                owned = owners == ffn_rank
                tokens = owned.any(dim=1).nonzero().flatten()
                peer = self._channel.topology.world_rank("ffn", ffn_rank)
                self._channel.finish_sends(peer, deadline)
                header = OpsHeader(
                    "dispatch", self._channel.next_call(peer), self._channel.world_rank, peer,
                    tokens.numel(), hidden_size, dtype, top_k, True, layer_index,
                )  # fmt: skip
                body = []
                if tokens.numel():
                    rows = rows_as_bytes(x.index_select(0, tokens))
                    body = [torch.cat([rows, ids.index_select(0, tokens).view(torch.uint8)], 1)]
                self._channel.send(peer, header, body)
                expanded.append(int(owned.sum()))
            self._dispatched = _Dispatched(layer_index, batch_size, tuple(expanded))
        return torch.zeros(1, dtype=torch.int8)

    @guarded
    def combine_recv(
        self,
        expand_x: torch.Tensor,
        expert_ids: torch.Tensor,
        expert_scales: torch.Tensor,
        world: AsyncWorld,
        batch_size: int,
        hidden_size: int,
        top_k: int,
    ) -> torch.Tensor:
        """The reference ``afd_async_combine_recv`` (see the module docstring)."""
        op = "afd_async_combine_recv"
        self._check_world(op, world, "attention")
        out_dtype = expand_x.dtype
        wire_dtype(op, self.name, "expand_x", expand_x)
        if list(expert_scales.shape) != [batch_size, top_k]:
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: expert_scales must be "
                f"[batch_size={batch_size}, top_k={top_k}], not {list(expert_scales.shape)}"
            )
        with self._lock:
            sent = self._dispatched
            if sent is None:
                raise AFDProtocolError(
                    f"afd_ascend::{op} on group {self.name!r}: {self._channel.me()} asks for "
                    "a combine but dispatched nothing on this group; call dispatch_send first"
                )
            owners = expert_ids.long() // world.route_expert_num_per_moe
            expanded = tuple(int((owners == f).sum()) for f in range(world.moe_rank_num))
            if batch_size != sent.tokens or expanded != sent.expanded_rows:
                raise AFDProtocolError(
                    f"afd_ascend::{op} on group {self.name!r}: batch_size={batch_size} and "
                    f"expert_ids routing {list(expanded)} rows per FFN rank, but the dispatch "
                    f"of layer {sent.layer} had {sent.tokens} tokens routing "
                    f"{list(sent.expanded_rows)}; pass that dispatch's expert_ids"
                )
            self._dispatched = None
            bodies = self._receive_answers(sent, hidden_size)
        if not batch_size:
            return torch.empty((0, hidden_size), dtype=out_dtype)
        rows = torch.cat([b.float() for b in bodies]) if bodies else expand_x.new_empty((0, 0))
        # Expanded rows of all FFN ranks in order are the (expert, token) pairs ascending.
        flat = expert_ids.long().reshape(-1)
        tokens = torch.arange(batch_size).repeat_interleave(top_k)
        order = torch.argsort(flat * batch_size + tokens)
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel())
        per_slot = rows.index_select(0, position).reshape(batch_size, top_k, hidden_size)
        weighted = per_slot * expert_scales.float().unsqueeze(-1)
        return weighted.sum(dim=1).to(out_dtype)

    def _receive_answers(self, sent: _Dispatched, hidden_size: int) -> list[torch.Tensor]:
        """Every FFN rank's answer to the dispatch ``sent``, in FFN rank order."""
        deadline = time.monotonic() + self._channel.timeout_s
        peers = [
            self._channel.topology.world_rank("ffn", f) for f in range(len(sent.expanded_rows))
        ]
        seqs = [self._channel.next_call(peer) for peer in peers]
        heads = [torch.empty(OpsHeader.SIZE, dtype=torch.uint8) for _ in peers]
        posted = [self._channel.post(p, h, send=False) for p, h in zip(peers, heads, strict=True)]
        headers = []
        for peer, seq, head, transfer, rows in zip(
            peers, seqs, heads, posted, sent.expanded_rows, strict=True
        ):
            doing = f"the combine of layer {sent.layer} (call {seq}) on group {self.name!r}"
            self._channel.wait(transfer, deadline, doing)
            expected = OpsHeader(
                "combine", seq, peer, self._channel.world_rank, rows, hidden_size, "bfloat16",
                layer=sent.layer,
            )  # fmt: skip
            headers.append(self._channel.check(head, expected, ignore=("dtype",)))
        for peer in peers:
            self._channel.finish_sends(peer, deadline)
        bodies, transfers = [], []
        for peer, header in zip(peers, headers, strict=True):
            if header.rows:
                body = torch.empty((header.rows, hidden_size), dtype=TORCH_DTYPES[header.dtype])
                transfers.append(self._channel.post(peer, body.view(torch.uint8), send=False))
                bodies.append(body)
        for transfer in transfers:
            what = f"the combine rows of {self._channel.describe(transfer.peer)}"
            self._channel.wait(transfer, deadline, f"{what} on group {self.name!r}")
        return bodies

    # -- FFN side --------------------------------------------------------------------

    @guarded
    def dispatch_recv(
        self,
        x: torch.Tensor,
        world: AsyncWorld,
        max_seq_len: int,
        hidden_size: int,
        top_k: int,
        dynamic_quant: int,
    ) -> list[torch.Tensor]:
        """The reference ``afd_async_dispatch_recv`` (see the module docstring)."""
        op = "afd_async_dispatch_recv"
        self._check_world(op, world, "ffn")
        dtype = wire_dtype(op, self.name, "x", x)
        _check_quant(op, dynamic_quant)
        check_positive(op, "hidden_size", hidden_size)
        check_positive(op, "top_k", top_k)
        epr = world.route_expert_num_per_moe
        with self._lock:
            sender, header, body = self._inbox(hidden_size).take()
            seq = self._channel.next_call(sender)
            expected = OpsHeader(
                "dispatch", seq, sender, self._channel.world_rank, header.rows, hidden_size, dtype,
                top_k, True, header.layer,
            )  # fmt: skip
            self._channel.compare(header, expected)
            tokens = header.rows
            if tokens > max_seq_len:
                raise AFDProtocolError(
                    f"afd_ascend::{op} on group {self.name!r}: "
                    f"{self._channel.describe(sender)} dispatched {tokens} tokens, more than "
                    f"max_seq_len={max_seq_len}; both roles must use the same "
                    "max_num_batched_tokens"
                )
            self._channel.finish_sends(sender, time.monotonic() + self._channel.timeout_s)
            row_bytes = hidden_size * x.element_size()
            body = body.view(tokens, row_bytes + top_k * 4)
            hidden = body[:, :row_bytes].reshape(-1).view(x.dtype).view(tokens, hidden_size)
            ids = body[:, row_bytes:].reshape(-1).view(torch.int32).view(tokens, top_k)
            local = ids.long() - self._channel.role_rank * epr
            owned = (local >= 0) & (local < epr)
            if tokens and not bool(owned.any(dim=1).all()):
                raise AFDProtocolError(
                    f"afd_ascend::{op} on group {self.name!r}: "
                    f"{self._channel.describe(sender)} sent a token with no expert of "
                    f"{self._channel.me()} (experts {self._channel.role_rank * epr}.."
                    f"{(self._channel.role_rank + 1) * epr - 1}); both roles must use the same "
                    "route_expert_num_per_moe and model"
                )
            pairs = owned.nonzero()  # (token, slot), token-major
            experts = local[pairs[:, 0], pairs[:, 1]]
            order = torch.argsort(experts * max(tokens, 1) + pairs[:, 0])
            capacity = dispatch_capacity(max_seq_len, top_k, epr)
            expanded = torch.empty((capacity, hidden_size), dtype=x.dtype)
            rows = int(order.numel())
            expanded[:rows] = hidden.index_select(0, pairs[order, 0])
            counts = torch.bincount(experts, minlength=epr)
            attention_rank = self._channel.topology.role_of_world_rank(sender)[1]
            info = torch.zeros(batch_info_size(world.tp_size, epr), dtype=torch.int64)
            info[: BATCH_INFO_FIELDS + 1] = torch.tensor(
                [tokens, attention_rank, header.layer, rows, seq, tokens]
            )
            info[BATCH_INFO_FIELDS + world.tp_size :: world.tp_size] = counts
            self._unanswered[sender] = _Unanswered(seq, header.layer, rows)
        return [expanded, torch.zeros(1, dtype=torch.float32), info, counts]

    @guarded
    def combine_send(
        self, expand_x: torch.Tensor, batch_info: torch.Tensor, world: AsyncWorld, hidden_size: int
    ) -> torch.Tensor:
        """The reference ``afd_async_combine_send`` (see the module docstring)."""
        op = "afd_async_combine_send"
        self._check_world(op, world, "ffn")
        dtype = wire_dtype(op, self.name, "expand_x", expand_x)
        info = batch_info.tolist()
        attention_rank, layer, rows, seq = (
            int(info[BATCH_INFO[key]]) for key in ("attention_rank", "layer", "rows", "seq")
        )
        if not 0 <= attention_rank < self._channel.topology.num_attention_ranks:
            raise AFDProtocolError(
                f"afd_ascend::{op} on group {self.name!r}: batch_info names attention rank "
                f"{attention_rank}; pass output [2] of the dispatch_recv being answered"
            )
        peer = self._channel.topology.world_rank("attention", attention_rank)
        with self._lock:
            pending = self._unanswered.pop(peer, None)
            if pending != _Unanswered(seq, layer, rows):
                raise AFDProtocolError(
                    f"afd_ascend::{op} on group {self.name!r}: batch_info {info[:5]} answers no "
                    f"dispatch {self._channel.me()} received on this group from "
                    f"{self._channel.describe(peer)} (unanswered: {pending}); pass output [2] "
                    "of the dispatch_recv being answered, once"
                )
            if expand_x.dim() != 2 or expand_x.shape[0] < rows or expand_x.shape[1] != hidden_size:
                raise ValueError(
                    f"afd_ascend::{op} on group {self.name!r}: expand_x must be [>= {rows}, "
                    f"hidden_size={hidden_size}], not {list(expand_x.shape)}"
                )
            deadline = time.monotonic() + self._channel.timeout_s
            self._channel.finish_sends(peer, deadline)
            header = OpsHeader(
                "combine", self._channel.next_call(peer), self._channel.world_rank, peer, rows,
                hidden_size, dtype, layer=layer,
            )  # fmt: skip
            self._channel.send(peer, header, [rows_as_bytes(expand_x[:rows])] if rows else [])
        return torch.zeros(1, dtype=torch.int8)

    def _inbox(self, hidden_size: int) -> Inbox:
        """The FFN rank's inbox of dispatches (its readers start on the first call)."""
        if self._dispatches is None:
            senders = tuple(
                self._channel.topology.world_rank("attention", a)
                for a in range(self._channel.topology.num_attention_ranks)
            )
            self._dispatches = Inbox(
                self._channel, senders, _dispatch_body_bytes,
                f"the next dispatch on group {self.name!r}",
            )  # fmt: skip
            if self._fuse.closed:  # interrupted meanwhile: stop the readers just started
                self._dispatches.close()
        return self._dispatches

    # -- checks ----------------------------------------------------------------------

    def _check_world(self, op: str, world: AsyncWorld, role: str) -> None:
        topology = self._channel.topology
        ours = AsyncWorld(
            topology.num_ffn_ranks,
            topology.num_attention_ranks,
            world.route_expert_num_per_moe,
            self._channel.role_rank,
            topology.world_size,
            world.tp_size,
        )
        if world != ours:
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: moe_rank_num={world.moe_rank_num}, "
                f"attn_rank_num={world.attn_rank_num}, rank id={world.role_rank}, "
                f"world_size={world.world_size}, but the group was opened for "
                f"{ours.moe_rank_num} FFN ranks, {ours.attn_rank_num} attention ranks, "
                f"{self._channel.role} rank {ours.role_rank} and {ours.world_size} ranks; pass the "
                "world's facts"
            )
        if self._channel.role != role:
            raise AFDConfigError(
                f"afd_ascend::{op} on group {self.name!r} is an {role} op, but this process "
                f"is {self._channel.me()}"
            )
        check_positive(op, "route_expert_num_per_moe", world.route_expert_num_per_moe)
        check_positive(op, "tp_size", world.tp_size)

    def _check_shapes(
        self,
        op: str,
        x: torch.Tensor,
        expert_ids: torch.Tensor,
        batch_size: int,
        hidden_size: int,
        top_k: int,
        world: AsyncWorld,
    ) -> None:
        check_positive(op, "hidden_size", hidden_size)
        check_positive(op, "top_k", top_k)
        if list(x.shape) != [batch_size, hidden_size]:
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: x must be [batch_size="
                f"{batch_size}, hidden_size={hidden_size}], not {list(x.shape)}"
            )
        if expert_ids.dtype != torch.int32 or list(expert_ids.shape) != [batch_size, top_k]:
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: expert_ids must be int32 "
                f"[{batch_size}, {top_k}], not {expert_ids.dtype} {list(expert_ids.shape)}"
            )
        experts = world.moe_rank_num * world.route_expert_num_per_moe
        if top_k > experts or (
            expert_ids.numel() and not 0 <= int(expert_ids.min()) <= int(expert_ids.max()) < experts
        ):
            raise ValueError(
                f"afd_ascend::{op} on group {self.name!r}: expert ids must lie in "
                f"0..{experts - 1} (moe_rank_num * route_expert_num_per_moe) and top_k="
                f"{top_k} must not exceed {experts}"
            )


def _dispatch_body_bytes(header: OpsHeader) -> int:
    """Bytes of the body after a dispatch header: each token's row and its int32 ids."""
    if header.op != "dispatch":
        return 0  # the header check names the wrong op
    itemsize = torch.empty(0, dtype=TORCH_DTYPES[header.dtype]).element_size()
    return header.rows * (header.hidden_size * itemsize + header.topk * 4)


def _check_quant(op: str, dynamic_quant: int) -> None:
    if dynamic_quant != 0:
        raise ValueError(
            f"afd_ascend::{op}: dynamic_quant={dynamic_quant}; the CPU reference kernels move "
            "unquantised rows only, pass 0"
        )
