"""Per-layer exchange of ExpertRoutedAFDConnector (gloo) against raw gloo and against P2P.

Processes on this host: ``--ffn-ranks`` FFN ranks and one attention rank (1A2F by
default). Every layer routes each token to ``TOP_K`` of ``NUM_EXPERTS`` experts (seeded,
the same on every rank), so each FFN rank gets the tokens with an expert in its block.
The same run alternates, layer by layer:

* **m2n**: the attention endpoint's ``send(..., routing=)`` + ``recv``; each FFN endpoint's
  ``recv`` + ``send`` of the received rows unchanged (identity "experts"), in steps of
  ``BLOCK`` layers, each announced by one control payload;
* **raw**: on a second gloo group between the same processes, exactly the connector's
  messages as bytes: to each FFN rank one message of 64 header bytes plus the routed
  body (rows' hidden states, top-k ids and weights), back one reply frame of the 64-byte
  header and the rows' partial result.

Then, in a separate pair of processes, the P2P connector's round trip for the same token
counts (:mod:`gloo_roundtrip`), for the cost of routing against sending every token to
one FFN rank. It prints medians and 10th percentiles (µs) and their ratios. Usage::

    PYTHONPATH=packages/afd-core/src:packages/afd-connectors-gpu/src \\
        python benchmarks/m2n_roundtrip.py [--rounds 8] [--ffn-ranks 2]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gloo_roundtrip import BLOCK, measure, run_ranks

TOKENS = (1, 8, 64)
HIDDEN = 2048
NUM_EXPERTS, TOP_K = 8, 2
TAG_PING, TAG_PONG = 21, 22
HEADER = 64


@dataclass(frozen=True)
class RoutedTrip:
    """Timings (µs) of one token count: one value per timed layer."""

    tokens: int
    raw_us: tuple[float, ...]
    m2n_us: tuple[float, ...]
    routed_bytes: int  # A2F bytes of one layer over all FFN ranks, headers included


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _p10(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10)[0]


def routing(tokens: int, layer: int) -> tuple[Any, Any, Any]:
    """Hidden states (bf16), top-k ids (int32) and weights (float32) of one layer."""
    import torch

    gen = torch.Generator().manual_seed(7919 * layer + tokens)
    hidden = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)])
    weights = torch.rand(tokens, TOP_K, generator=gen)
    return hidden, ids.int(), weights


def rows_of(ids: Any, ffn_ranks: int) -> list[int]:
    """Rows routed to each FFN rank (the connector's placement and rule)."""
    import torch

    from afd_core.placement import ExpertPlacement
    from afd_core.runtime.expert.routing import rows_per_rank

    placement = ExpertPlacement(NUM_EXPERTS, ffn_ranks)
    owners = torch.tensor([placement.owner(e) for e in range(NUM_EXPERTS)])
    return [int(r.numel()) for r in rows_per_rank(ids, owners, ffn_ranks)]


def body_bytes(rows: int) -> int:
    return rows * (HIDDEN * 2 + TOP_K * 8)


def _raw_group(rank: int, size: int, port: int) -> Any:
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", port, None, rank == 0, timedelta(seconds=60), wait_for_workers=False
    )
    return store, dist.ProcessGroupGloo(
        dist.PrefixStore("raw/", store), rank, size, timedelta(seconds=60)
    )


def _connector(role: str, rank: int, port: int, ffn_ranks: int) -> Any:
    from afd_connectors_gpu.expert_routed import ExpertRoutedAFDConnector
    from afd_core.config import AFDConfig
    from afd_core.connector import WireSpec

    config = AFDConfig(
        role=role,  # type: ignore[arg-type]
        connector="ExpertRoutedAFDConnector",
        port=port,
        num_attention_ranks=1,
        num_ffn_ranks=ffn_ranks,
        compute_gate_on_attention=True,
        connector_extra_config={"transport": "gloo"},
        expert_placement="balanced",
    )
    wire = WireSpec(
        hidden_size=HIDDEN,
        dtype="bfloat16",
        num_exchange_layers=BLOCK,
        router_logits_width=NUM_EXPERTS,
        num_experts=NUM_EXPERTS,
        top_k=TOP_K,
        exchange_layer_ids=tuple(range(BLOCK)),
    )
    conn = ExpertRoutedAFDConnector(config, rank, wire)
    conn.initialize()
    return conn


def _ffn(rank: int, conn_port: int, raw_port: int, rounds: int, ffn_ranks: int) -> None:
    import torch

    torch.set_num_threads(1)
    _, raw = _raw_group(rank, ffn_ranks + 1, raw_port)
    attention = ffn_ranks  # world rank of the attention rank in both groups
    conn = _connector("ffn", rank, conn_port, ffn_ranks)
    for tokens in TOKENS:
        inbox = torch.empty(HEADER + body_bytes(tokens), dtype=torch.uint8)
        reply = torch.zeros(HEADER + tokens * HIDDEN * 2, dtype=torch.uint8)
        mine = [rows_of(routing(tokens, layer)[1], ffn_ranks)[rank] for layer in range(BLOCK)]
        for _ in range(rounds + 1):
            step = conn.ffn.next_step()
            for layer, rows in enumerate(mine):
                raw.recv([inbox], attention, TAG_PING).wait()
                raw.send([reply[: HEADER + rows * HIDDEN * 2]], attention, TAG_PONG).wait()
                batch = conn.ffn.recv(step, layer, 0)
                conn.ffn.send(batch, batch.hidden)
    conn.close()


def _attention(conn_port: int, raw_port: int, rounds: int, ffn_ranks: int, out: Any) -> None:
    import torch

    from afd_core.connector import ExpertRouting
    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    torch.set_num_threads(1)
    _, raw = _raw_group(ffn_ranks, ffn_ranks + 1, raw_port)
    conn = _connector("attention", 0, conn_port, ffn_ranks)
    results, step_id = [], 0
    for tokens in TOKENS:
        layers = [routing(tokens, layer) for layer in range(BLOCK)]
        rows = [rows_of(ids, ffn_ranks) for _, ids, _ in layers]
        sends = [
            [torch.zeros(HEADER + body_bytes(r), dtype=torch.uint8) for r in per_rank]
            for per_rank in rows
        ]
        replies = [
            [torch.empty(HEADER + r * HIDDEN * 2, dtype=torch.uint8) for r in per_rank]
            for per_rank in rows
        ]
        raw_us, m2n_us = [], []
        for r in range(rounds + 1):
            conn.attention.begin_step(ControlPayload(step_id, 0, (AFDDPMetadata(0, (tokens,)),)))
            step_id += 1
            for layer, (hidden, ids, weights) in enumerate(layers):
                t0 = time.perf_counter()
                works = []
                for f in range(ffn_ranks):
                    works.append(raw.recv([replies[layer][f]], f, TAG_PONG))
                    works.append(raw.send([sends[layer][f]], f, TAG_PING))
                for work in works:
                    work.wait()
                t1 = time.perf_counter()
                conn.attention.send(layer, 0, hidden, routing=ExpertRouting(ids, weights))
                conn.attention.recv(layer, 0)
                t2 = time.perf_counter()
                if r:
                    raw_us.append((t1 - t0) * 1e6)
                    m2n_us.append((t2 - t1) * 1e6)
        routed = sum(HEADER + body_bytes(n) for n in rows[0])
        results.append(RoutedTrip(tokens, tuple(raw_us), tuple(m2n_us), routed))
    conn.close()
    out.put(results)


def format_table(rows: Sequence[RoutedTrip], p2p: dict[int, float], ffn_ranks: int) -> str:
    """The table of :func:`main`: M:N against raw and against P2P, per token count."""
    lines = [
        f"1A{ffn_ranks}F expert-routed per-layer exchange, µs (bf16, hidden {HIDDEN}, "
        f"{NUM_EXPERTS} experts, top-{TOP_K}; raw: the same messages on a plain gloo group; "
        "p2p: P2pGlooAFDConnector 1A1F, same tokens, median)",
        f"{'tokens':>6} {'A2F bytes':>9} | {'raw med':>8} {'m2n med':>8} {'ratio':>5} | "
        f"{'raw p10':>8} {'m2n p10':>8} {'ratio':>5} | {'p2p med':>8} {'m2n/p2p':>7}",
    ]
    for row in rows:
        raw_med, m2n_med = _median(row.raw_us), _median(row.m2n_us)
        raw_p10, m2n_p10 = _p10(row.raw_us), _p10(row.m2n_us)
        lines.append(
            f"{row.tokens:>6} {row.routed_bytes:>9} | {raw_med:>8.1f} {m2n_med:>8.1f} "
            f"{m2n_med / raw_med:>5.2f} | {raw_p10:>8.1f} {m2n_p10:>8.1f} "
            f"{m2n_p10 / raw_p10:>5.2f} | {p2p[row.tokens]:>8.1f} "
            f"{m2n_med / p2p[row.tokens]:>7.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    from afd_core.tools.launch import free_ports

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="timed blocks per size")
    parser.add_argument("--ffn-ranks", type=int, default=2, choices=(1, 2, 3, 4))
    args = parser.parse_args()
    conn_port, raw_port = free_ports(2)
    rows = run_ranks(
        [functools.partial(_ffn, rank) for rank in range(args.ffn_ranks)],
        _attention,
        (conn_port, raw_port, args.rounds, args.ffn_ranks),
        "M:N round-trip benchmark",
    )
    p2p = {t.tokens: t.conn_median for t in measure(args.rounds, TOKENS, (HIDDEN,))}
    print(format_table(rows, p2p, args.ffn_ranks))


if __name__ == "__main__":
    main()
