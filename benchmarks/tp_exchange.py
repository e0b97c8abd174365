"""Per-layer exchange of the two attention-TP designs at TP 2, on gloo (CPU): time and bytes.

Three processes on one host: attention TP ranks 0 and 1 (their own gloo group, as
vLLM's TP group) and an FFN rank that sends back what it receives (no compute), all
over ``torch.distributed`` gloo. Per layer, for T tokens of hidden size H (bf16, moved
as bytes):

* ``leader`` (what afd-attention does, :mod:`afd_attention.tensor_parallel`): TP rank 0
  sends its T rows to the FFN rank, receives T rows back and broadcasts them over the TP
  group; TP rank 1 only takes the broadcast;
* ``split``: each TP rank sends its ceil(T/2) rows (the last one padded), receives them
  back, and the two all-gather the halves.

A layer is timed on each attention rank from a barrier to its result in hand; medians
over ``--rounds`` layers per size (after 20 warm-up layers), the designs alternated size
by size. Bytes per layer: on each attention rank's link with the FFN rank (both ways)
and over the TP group.

Usage::

    python benchmarks/tp_exchange.py [--rounds 200] [--tokens 1 8 64 256] [--hidden 128 2048]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

from bench_host import cpu_model, load_average

DESIGNS = ("leader", "split")
TOKENS = (1, 8, 64, 256)
HIDDEN = (128, 2048)
ROUNDS = 200
WARMUP = 20
FFN_RANK = 2
BYTES_PER_VALUE = 2  # bf16


def main(argv: Sequence[str] | None = None) -> int:
    """Run both designs at every size and print the table; return 0."""
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    args = parser.parse_args(argv)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load {load_average()}")
    port = _free_port()
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(
        _rank,
        args=(port, args.tokens, args.hidden, args.rounds, results),
        nprocs=3,
        start_method="spawn",
    )
    rows: dict[tuple[str, int, int, int], float] = {}
    while not results.empty():
        design, tokens, hidden, rank, median_us = results.get()
        rows[design, tokens, hidden, rank] = median_us
    print(
        f"per-layer exchange at attention TP 2 over gloo: median of {args.rounds} layers (µs) "
        "on TP rank 0 / TP rank 1; bytes per layer on each attention rank's FFN link (both "
        "ways) and over the TP group"
    )
    print(
        f"{'H':>5} {'T':>4} | {'leader r0/r1 µs':>16} {'link B':>8} {'TP B':>8} | "
        f"{'split r0/r1 µs':>16} {'link B':>8} {'TP B':>8}"
    )
    for hidden in args.hidden:
        for tokens in args.tokens:
            cells = []
            for design in DESIGNS:
                link, tp = _bytes(design, tokens, hidden)
                r0, r1 = rows[design, tokens, hidden, 0], rows[design, tokens, hidden, 1]
                cells.append(f"{r0:7.0f}/{r1:<7.0f}  {link:>8} {tp:>8}")
            print(f"{hidden:>5} {tokens:>4} | " + " | ".join(cells))
    print(f"load at end: {load_average()}")
    return 0


def _bytes(design: str, tokens: int, hidden: int) -> tuple[int, int]:
    """(bytes on one attention rank's FFN link, both ways; bytes over the TP group)."""
    row = hidden * BYTES_PER_VALUE
    if design == "leader":
        return 2 * tokens * row, tokens * row
    half = -(-tokens // 2)
    return 2 * half * row, 2 * half * row


def _rank(
    rank: int, port: int, tokens: list[int], hidden: list[int], rounds: int, results: object
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    tp_group = dist.new_group([0, 1])
    for h in hidden:
        for t in tokens:
            for design in DESIGNS:
                times = [_layer(design, rank, t, h, tp_group) for _ in range(WARMUP + rounds)]
                if rank != FFN_RANK:
                    median_us = statistics.median(times[WARMUP:]) * 1e6
                    results.put((design, t, h, rank, median_us))  # type: ignore[attr-defined]
    dist.barrier()
    dist.destroy_process_group()


def _layer(design: str, rank: int, tokens: int, hidden: int, tp_group: object) -> float:
    """One layer's exchange on ``rank``; the seconds from the barrier to its result."""
    import torch
    import torch.distributed as dist

    row = hidden * BYTES_PER_VALUE
    dist.barrier()
    began = time.perf_counter()
    if design == "leader":
        if rank == 0:
            dist.send(torch.ones(tokens * row, dtype=torch.uint8), FFN_RANK)
            out = torch.empty(tokens * row, dtype=torch.uint8)
            dist.recv(out, FFN_RANK)
            dist.broadcast(out, 0, group=tp_group)
        elif rank == 1:
            dist.broadcast(torch.empty(tokens * row, dtype=torch.uint8), 0, group=tp_group)
        else:
            buffer = torch.empty(tokens * row, dtype=torch.uint8)
            dist.recv(buffer, 0)
            dist.send(buffer, 0)
        return time.perf_counter() - began
    size = -(-tokens // 2) * row
    if rank == FFN_RANK:
        parts = [torch.empty(size, dtype=torch.uint8) for _ in range(2)]
        for request in [dist.irecv(parts[r], r) for r in (0, 1)]:
            request.wait()
        for request in [dist.isend(parts[r], r) for r in (0, 1)]:
            request.wait()
        return time.perf_counter() - began
    dist.send(torch.ones(size, dtype=torch.uint8), FFN_RANK)
    back = torch.empty(size, dtype=torch.uint8)
    dist.recv(back, FFN_RANK)
    halves = [torch.empty(size, dtype=torch.uint8) for _ in range(2)]
    dist.all_gather(halves, back, group=tp_group)
    return time.perf_counter() - began


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
