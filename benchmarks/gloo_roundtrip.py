"""Per-layer round trip of P2pGlooAFDConnector against a raw gloo ping-pong.

Two processes (FFN rank 0, attention rank 0) on this host. For every token count and
hidden size (bf16) the same run alternates, layer by layer (so both see the same load
from anything else on the host):

* **connector**: attention ``send_hidden`` + ``recv_output``; FFN ``recv_hidden`` +
  ``send_output`` of the unchanged hidden states (identity compute), in steps of
  ``BLOCK`` layers;
* **raw**: a ``ProcessGroupGloo`` ping-pong of the same hidden-state bytes each way
  (receive posted before the send, like the connector), on a second group between the
  same two processes.

It prints the median and the 10th percentile round trip of each (µs) and their ratios.
Usage::

    PYTHONPATH=packages/afd-core/src python benchmarks/gloo_roundtrip.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time
from datetime import timedelta
from typing import Any

TOKENS = (1, 8, 64, 256)
HIDDEN = (128, 2048)
BLOCK = 50  # layers per connector step
TAG_PING, TAG_PONG = 11, 12


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _raw_group(rank: int, port: int) -> Any:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", port, None, rank == 0, timedelta(seconds=60), wait_for_workers=False
    )
    return store, dist.ProcessGroupGloo(
        dist.PrefixStore("raw/", store), rank, 2, timedelta(seconds=60)
    )


def _connector(role: str, port: int, hidden: int) -> Any:
    from afd_core.config import AFDConfig
    from afd_core.connector import WireSpec
    from afd_core.connectors.gloo import P2pGlooAFDConnector

    config = AFDConfig(role=role, connector="P2pGlooAFDConnector", port=port)
    wire = WireSpec(hidden_size=hidden, dtype="bfloat16", num_exchange_layers=BLOCK)
    conn = P2pGlooAFDConnector(config, 0, wire)
    conn.initialize()
    return conn


def _ffn(conn_port: int, raw_port: int, rounds: int) -> None:
    import torch

    torch.set_num_threads(1)
    _, raw = _raw_group(0, raw_port)
    for hidden in HIDDEN:
        conn = _connector("ffn", conn_port, hidden)
        for tokens in TOKENS:
            buf = torch.empty(tokens * hidden, dtype=torch.bfloat16)
            for _ in range(rounds + 1):  # the first round warms up
                step = conn.control_plane.recv_step()
                for layer in range(BLOCK):
                    raw.recv([buf], 1, TAG_PING).wait()
                    raw.send([buf], 1, TAG_PONG).wait()
                    batch = conn.recv_hidden(step, layer, 0)
                    conn.send_output(batch, batch.hidden)
        conn.close()
        conn_port += 1


def _attention(conn_port: int, raw_port: int, rounds: int, out: Any) -> None:
    import torch

    from afd_core.connectors.p2p_wire import a2f_header
    from afd_core.metadata import AFDDPMetadata, ControlPayload

    torch.set_num_threads(1)
    _, raw = _raw_group(1, raw_port)
    rows = []
    for hidden in HIDDEN:
        conn = _connector("attention", conn_port, hidden)
        step_id = 0
        for tokens in TOKENS:
            x = torch.randn(tokens, hidden).to(torch.bfloat16)
            y = torch.empty_like(x)
            ping, pong = x.view(-1), torch.empty(tokens * hidden, dtype=torch.bfloat16)
            raw_us, conn_us = [], []
            for r in range(rounds + 1):
                payload = ControlPayload(step_id, 0, (AFDDPMetadata(0, (tokens,)),))
                conn.control_plane.send_step(payload)
                for layer in range(BLOCK):  # alternate, so both see the same load
                    t0 = time.perf_counter()
                    work = raw.recv([pong], 0, TAG_PONG)
                    raw.send([ping], 0, TAG_PING).wait()
                    work.wait()
                    t1 = time.perf_counter()
                    header = a2f_header(step_id, layer, 0, tokens, 0, conn.wire)
                    conn.send_hidden(header, x)
                    conn.recv_output(header, y)
                    t2 = time.perf_counter()
                    if r:
                        raw_us.append((t1 - t0) * 1e6)
                        conn_us.append((t2 - t1) * 1e6)
                step_id += 1
            assert torch.equal(x, y)
            rows.append((tokens, hidden, tokens * hidden * 2, raw_us, conn_us))
        conn.close()
        conn_port += 1
    out.put(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed blocks per size")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    conn_port, raw_port = _free_port(), _free_port()
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_ffn, args=(conn_port, raw_port, args.rounds)),
        ctx.Process(target=_attention, args=(conn_port, raw_port, args.rounds, out)),
    ]
    for proc in procs:
        proc.start()
    try:
        rows = out.get(timeout=600)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    print(
        f"per-layer round trip in µs over {args.rounds * BLOCK} layers (bf16; the connector "
        "adds a 64-byte header each way; p10 is less sensitive to other load on the host)"
    )
    print(
        f"{'tokens':>6} {'hidden':>6} {'bytes/dir':>10} | {'raw med':>8} {'conn med':>8} "
        f"{'ratio':>5} | {'raw p10':>8} {'conn p10':>8} {'ratio':>5}"
    )
    for tokens, hidden, nbytes, raw_us, conn_us in rows:
        raw_med, conn_med = statistics.median(raw_us), statistics.median(conn_us)
        raw_p10 = statistics.quantiles(raw_us, n=10)[0]
        conn_p10 = statistics.quantiles(conn_us, n=10)[0]
        print(
            f"{tokens:>6} {hidden:>6} {nbytes:>10} | {raw_med:>8.1f} {conn_med:>8.1f} "
            f"{conn_med / raw_med:>5.2f} | {raw_p10:>8.1f} {conn_p10:>8.1f} "
            f"{conn_p10 / raw_p10:>5.2f}"
        )


if __name__ == "__main__":
    main()
