"""Two identical raw gloo ping-pongs on two groups: how far apart they land (an A/A test).

Why ``benchmarks/gloo_roundtrip.py`` runs its raw ping-pong on the connector's own gloo
group: every ``ProcessGroupGloo`` has an I/O thread of its own, and on a 2-core host
the scheduler places the two groups' threads differently. This script alternates, layer
by layer, the same ping-pong (receive posted before the send) on group A and on group
B between the same two processes and prints, per message size, both medians and B / A.
Any distance from 1.00 is the noise floor of a comparison across two groups.
Usage::

    python benchmarks/gloo_two_groups.py [--layers 800] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta
from typing import Any

from gloo_roundtrip import run_pair

SIZES = (256, 4096, 32768, 262144)
WARMUP = 50
TAG_PING, TAG_PONG = 11, 12


def _groups(rank: int, port: int) -> tuple[Any, list[Any]]:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", port, None, rank == 0, timedelta(seconds=60), wait_for_workers=False
    )
    timeout = timedelta(seconds=60)
    groups = [dist.ProcessGroupGloo(dist.PrefixStore(p, store), rank, 2, timeout) for p in "AB"]
    return store, groups


def _echo(port: int, layers: int) -> None:
    import torch

    torch.set_num_threads(1)
    _store, groups = _groups(0, port)
    for nbytes in SIZES:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        for _ in range(WARMUP + layers):
            for group in groups:
                group.recv([buffer], 1, TAG_PING).wait()
                group.send([buffer], 1, TAG_PONG).wait()


def _time(port: int, layers: int, out: Any) -> None:
    import torch

    torch.set_num_threads(1)
    _store, groups = _groups(1, port)
    rows = []
    for nbytes in SIZES:
        ping = torch.zeros(nbytes, dtype=torch.uint8)
        pong = torch.empty(nbytes, dtype=torch.uint8)
        times: list[list[float]] = [[], []]
        for layer in range(WARMUP + layers):
            for which, group in enumerate(groups):
                t0 = time.perf_counter()
                reply = group.recv([pong], 0, TAG_PONG)
                group.send([ping], 0, TAG_PING).wait()
                reply.wait()
                if layer >= WARMUP:
                    times[which].append((time.perf_counter() - t0) * 1e6)
        rows.append((nbytes, statistics.median(times[0]), statistics.median(times[1])))
    out.put(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=800, help="timed round trips per size")
    parser.add_argument("--runs", type=int, default=3, help="runs, each with new processes")
    args = parser.parse_args()
    from afd_core.tools.launch import free_ports

    print("run  bytes/dir | group A med µs  group B med µs  B / A")
    for run in range(args.runs):
        (port,) = free_ports(1)
        for nbytes, a, b in run_pair(_echo, _time, (port, args.layers), "A/A ping-pong"):
            print(f"{run:>3} {nbytes:>10} | {a:>14.1f} {b:>15.1f} {b / a:>6.2f}")


if __name__ == "__main__":
    main()
