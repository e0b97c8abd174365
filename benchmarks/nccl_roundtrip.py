"""Per-layer round trip of P2pNcclAFDConnector against a raw NCCL ping-pong (two GPUs).

Two spawned processes: FFN rank 0 on cuda:0, attention rank 0 on cuda:1. For every token
count and hidden size (bf16) the same run alternates, layer by layer:

* **connector**: the attention endpoint's ``send`` + ``recv``; the FFN endpoint's
  ``recv`` + ``send`` of the unchanged hidden states (identity compute), in steps of
  ``BLOCK`` layers, each announced by one control payload (``send_step``);
* **raw**: a ``ProcessGroupNCCL`` send/recv ping-pong of the same hidden-state bytes each
  way (send first, like the connector), on a second NCCL group between the same two
  processes.

Both are timed on the attention rank from the host (``time.perf_counter``), each ending
with a synchronisation of the current stream, eager. With ``--graph`` two more, timed
with CUDA events on the attention rank:

* **raw graph**: the raw ping-pong captured in a CUDA graph of ``BLOCK`` round trips on
  a third NCCL group (warmed up before capture): the floor;
* **connector graph**: the connector's graph steps (header-less messages): each side
  captures ``BLOCK`` layers of its exchange (attention: ``send`` + ``recv``; FFN:
  ``recv_into`` + ``send_from``, identity compute)
  when the attention rank announces the capture step; then every timed step is one
  control payload (``send_step``) and one replay per side, queued back to back as a
  decoding attention rank does. The per-step control payload and the FFN rank's host
  turnaround (it waits for each replay before taking the next step) are included,
  spread over the step's ``BLOCK`` layers.

``NCCL_GRAPH_MIXING_SUPPORT=0`` is set for both processes unless already set.

Prints one table: medians and 10th percentiles (µs), connector / raw ratios, and the
graph floor. Usage (needs two CUDA devices, afd-core and afd-connectors-gpu)::

    python benchmarks/nccl_roundtrip.py [--rounds 8] [--graph]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gloo_roundtrip import run_pair

TOKENS = (1, 8, 64, 256, 512)
HIDDEN = (2048, 7168)
BLOCK = 50  # layers per connector step, and round trips per captured graph
FFN_DEVICE, ATTENTION_DEVICE = 0, 1
GRAPH_REPLAYS = 20


@dataclass(frozen=True)
class RoundTrip:
    """Timings (µs) of one (tokens, hidden) size, one value per timed layer (eager) or
    per round trip of one graph replay (``graph_us``, empty without ``--graph``)."""

    tokens: int
    hidden: int
    raw_us: tuple[float, ...]
    conn_us: tuple[float, ...]
    graph_us: tuple[float, ...]
    conn_graph_us: tuple[float, ...] = ()

    @property
    def nbytes(self) -> int:
        """Hidden-state bytes each way (bf16)."""
        return self.tokens * self.hidden * 2


def _p10(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10)[0]


def _nccl_group(store: Any, prefix: str, rank: int) -> Any:
    import torch.distributed as dist

    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timedelta(seconds=120)
    return dist.ProcessGroupNCCL(dist.PrefixStore(prefix, store), rank, 2, options)


def _groups(rank: int, port: int, graph: bool) -> tuple[Any, Any, Any]:
    """The store and the raw eager and graph NCCL groups (graph: None without ``--graph``)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", port, None, rank == 0, timedelta(seconds=120), wait_for_workers=False
    )
    return (
        store,
        _nccl_group(store, "raw/", rank),
        _nccl_group(store, "graph/", rank) if graph else None,
    )


def _connector(role: str, port: int, hidden: int) -> Any:
    from afd_connectors_gpu.p2p_nccl import P2pNcclAFDConnector
    from afd_core.config import AFDConfig
    from afd_core.connector import WireSpec

    config = AFDConfig(
        role=role,
        connector="P2pNcclAFDConnector",
        port=port,
    )
    wire = WireSpec(hidden_size=hidden, dtype="bfloat16", num_exchange_layers=BLOCK)
    conn = P2pNcclAFDConnector(config, 0, wire)
    conn.initialize()
    return conn


def _pingpong_graph(
    torch: Any, pg: Any, peer: int, first: Any, second: Any, sends_first: bool
) -> Any:
    """A CUDA graph of ``BLOCK`` round trips on ``pg`` (warmed up eagerly first)."""

    def trip() -> None:
        if sends_first:
            pg.send([first], peer, 0).wait()
            pg.recv([second], peer, 0).wait()
        else:
            pg.recv([first], peer, 0).wait()
            pg.send([first], peer, 0).wait()

    trip()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(BLOCK):
            trip()
    torch.cuda.synchronize()
    return graph


def _ffn(
    conn_port: int,
    raw_port: int,
    rounds: int,
    tokens_list: Sequence[int],
    hiddens: Sequence[int],
    graph: bool,
) -> None:
    import torch

    torch.cuda.set_device(FFN_DEVICE)
    _store, raw, graph_pg = _groups(0, raw_port, graph)
    for hidden in hiddens:
        conn = _connector("ffn", conn_port, hidden)
        for tokens in tokens_list:
            buf = torch.empty(tokens * hidden, dtype=torch.bfloat16, device="cuda")
            for _ in range(rounds + 1):  # the first round warms up
                step = conn.ffn.next_step()
                for layer in range(BLOCK):
                    raw.recv([buf], 1, 0).wait()
                    raw.send([buf], 1, 0).wait()
                    batch = conn.ffn.recv(step, layer, 0)
                    conn.ffn.send(batch, batch.hidden)
            if graph_pg is not None:
                g = _pingpong_graph(torch, graph_pg, 1, buf, buf, sends_first=False)
                for _ in range(GRAPH_REPLAYS + 3):
                    g.replay()
                torch.cuda.synchronize()
                _ffn_connector_graph(torch, conn, buf.view(tokens, hidden))
        conn.close()
        conn_port += 1


def _ffn_connector_graph(torch: Any, conn: Any, buf: Any) -> None:
    """FFN side of the connector graph: capture on the capture step, replay the others."""
    step = conn.ffn.next_step()
    assert step.is_graph_capturing, "expected the capture step"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for layer in range(BLOCK):
            conn.ffn.recv_into(step, layer, 0, buf, None)
            conn.ffn.send_from(step, layer, 0, buf)
    for _ in range(GRAPH_REPLAYS + 3):
        step = conn.ffn.next_step()
        assert step.is_graph_step and not step.is_graph_capturing
        graph.replay()
        conn.ffn.wait_for_stream("a benchmark replay")


def _attention_connector_graph(
    torch: Any, conn: Any, x: Any, step_id: int
) -> tuple[tuple[float, ...], int]:
    """Attention side of the connector graph; per-layer µs of each timed replay."""
    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    tokens = x.shape[0]

    def payload(capturing: bool) -> Any:
        return ControlPayload(
            step_id,
            0,
            (AFDDPMetadata(0, (tokens,)),),
            is_graph_capturing=capturing,
            is_graph_step=True,
        )

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    endpoint = conn.attention
    with endpoint.graph_capture(), torch.cuda.graph(graph):  # vLLM's capture mode (global)
        endpoint.begin_step(payload(True))
        for layer in range(BLOCK):
            endpoint.send(layer, 0, x)
            y = endpoint.recv(layer, 0)  # graph memory: each replay writes it again
    step_id += 1
    events = []
    for _ in range(GRAPH_REPLAYS + 3):
        endpoint.begin_step(payload(False))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        endpoint.watch_graph_replay(step_id)
        events.append((start, end))
        step_id += 1
    torch.cuda.synchronize()
    if not torch.equal(x, y):
        raise AssertionError("the connector's captured round trip changed the data")
    timed = tuple(s.elapsed_time(e) * 1e3 / BLOCK for s, e in events[3:])
    return timed, step_id


def _attention(
    conn_port: int,
    raw_port: int,
    rounds: int,
    tokens_list: Sequence[int],
    hiddens: Sequence[int],
    graph: bool,
    out: Any,
) -> None:
    import torch

    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    torch.cuda.set_device(ATTENTION_DEVICE)
    stream = torch.cuda.current_stream()
    _store, raw, graph_pg = _groups(1, raw_port, graph)
    rows = []
    for hidden in hiddens:
        conn = _connector("attention", conn_port, hidden)
        step_id = 0
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
            ping = x.view(-1)
            pong = torch.empty(tokens * hidden, dtype=torch.bfloat16, device="cuda")
            raw_us, conn_us, graph_us = [], [], []
            for r in range(rounds + 1):
                conn.attention.begin_step(
                    ControlPayload(step_id, 0, (AFDDPMetadata(0, (tokens,)),))
                )
                for layer in range(BLOCK):  # alternate, so both see the same load
                    t0 = time.perf_counter()
                    sent = raw.send([ping], 0, 0)
                    received = raw.recv([pong], 0, 0)
                    sent.wait()
                    received.wait()
                    stream.synchronize()
                    t1 = time.perf_counter()
                    conn.attention.send(layer, 0, x)
                    y = conn.attention.recv(layer, 0)
                    stream.synchronize()
                    t2 = time.perf_counter()
                    if r:
                        raw_us.append((t1 - t0) * 1e6)
                        conn_us.append((t2 - t1) * 1e6)
                step_id += 1
            if not (torch.equal(x, y) and torch.equal(x.view(-1), pong)):
                raise AssertionError(
                    f"round trip changed the data (tokens {tokens}, hidden {hidden})"
                )
            if graph_pg is not None:
                g = _pingpong_graph(torch, graph_pg, 0, ping, pong, sends_first=True)
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                for i in range(GRAPH_REPLAYS + 3):
                    start.record()
                    g.replay()
                    end.record()
                    end.synchronize()
                    if i >= 3:
                        graph_us.append(start.elapsed_time(end) * 1e3 / BLOCK)
                if not torch.equal(x.view(-1), pong):
                    raise AssertionError("the captured round trip changed the data")
                conn_graph_us, step_id = _attention_connector_graph(torch, conn, x, step_id)
            else:
                conn_graph_us = ()
            rows.append(
                RoundTrip(
                    tokens,
                    hidden,
                    tuple(raw_us),
                    tuple(conn_us),
                    tuple(graph_us),
                    conn_graph_us,
                )
            )
        conn.close()
        conn_port += 1
    out.put(rows)


def measure(
    rounds: int = 8,
    tokens: Sequence[int] = TOKENS,
    hiddens: Sequence[int] = HIDDEN,
    graph: bool = False,
) -> list[RoundTrip]:
    """Run both processes and return one :class:`RoundTrip` per (hidden, tokens) size.

    Each size gets ``rounds`` timed steps of :data:`BLOCK` layers after one warm-up step
    (and with ``graph`` :data:`GRAPH_REPLAYS` timed replays). Both processes end before
    it returns.
    """
    from afd_core.tools.launch import free_ports

    os.environ.setdefault("NCCL_GRAPH_MIXING_SUPPORT", "0")  # inherited by both processes
    conn_port, raw_port = free_ports(2)
    sizes = (rounds, tuple(tokens), tuple(hiddens), graph)
    return run_pair(_ffn, _attention, (conn_port, raw_port, *sizes), "NCCL round-trip benchmark")


def format_table(rows: Sequence[RoundTrip], rounds: int) -> str:
    """The round-trip table of ``rows`` (from :func:`measure` with ``rounds``) as text."""
    mixing = os.environ.get("NCCL_GRAPH_MIXING_SUPPORT")
    lines = [
        f"per-layer round trip in µs over {rounds * BLOCK} layers, cuda:{ATTENTION_DEVICE} "
        f"<-> cuda:{FFN_DEVICE}, bf16, eager (host timed, stream synchronised); the "
        "connector adds a 64-byte header each way; graph: raw ping-pong captured "
        f"{BLOCK} times per graph, and the connector's graph steps ({BLOCK} layers and one "
        "control payload per step), CUDA-event timed per replay, medians; "
        f"NCCL_GRAPH_MIXING_SUPPORT={mixing}",
        f"{'tokens':>6} {'hidden':>6} {'bytes/dir':>10} | {'raw med':>8} {'conn med':>8} "
        f"{'ratio':>5} {'+us':>6} | {'raw p10':>8} {'conn p10':>8} {'ratio':>5} | "
        f"{'graph med':>9} {'conn gr':>7} {'ratio':>5}",
    ]
    for row in rows:
        raw_med, conn_med = statistics.median(row.raw_us), statistics.median(row.conn_us)
        raw_p10, conn_p10 = _p10(row.raw_us), _p10(row.conn_us)
        if row.graph_us and row.conn_graph_us:
            graph_med = statistics.median(row.graph_us)
            conn_graph_med = statistics.median(row.conn_graph_us)
            graph = f"{graph_med:>9.1f} {conn_graph_med:>7.1f} {conn_graph_med / graph_med:>5.2f}"
        else:
            graph = f"{'-':>9} {'-':>7} {'-':>5}"
        lines.append(
            f"{row.tokens:>6} {row.hidden:>6} {row.nbytes:>10} | {raw_med:>8.1f} "
            f"{conn_med:>8.1f} {conn_med / raw_med:>5.2f} {conn_med - raw_med:>6.1f} | "
            f"{raw_p10:>8.1f} {conn_p10:>8.1f} {conn_p10 / raw_p10:>5.2f} | {graph}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed steps per size")
    parser.add_argument(
        "--graph", action="store_true", help="also time the raw ping-pong in a CUDA graph"
    )
    args = parser.parse_args()
    rows = measure(args.rounds, graph=args.graph)
    print(format_table(rows, args.rounds))


if __name__ == "__main__":
    main()
