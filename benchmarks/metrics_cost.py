"""What AFD's metrics cost per decode step, on and off (#35): a benchmark, not a test.

AFD's metrics are plain counters that the roles update on their hot paths, and a
Prometheus rendering that runs only when ``/metrics`` is scraped. There is no switch to
turn the counters off, so "off" here is the same per-step loop without the bookkeeping.
This times, on this machine, with the project's own classes:

* **attention role**, per layer and stage of a step (``StepDriver.exchange``): three
  ``time.perf_counter()`` calls, the wait-time sum, one ``Histogram.observe`` of the
  exchange time; per step: the completed-step counters;
* **FFN role**, per layer and stage (``StepLoop._serve_layer`` and ``LayerCompute``): two
  ``time.perf_counter()`` calls, the busy-time sum, the rows and layer counters; per step:
  the token counters, by attention rank too;
* **a scrape**: ``afd_core.metrics.exposition`` of one attention and one FFN worker's
  ``afd_stats`` (off the hot path: the API server renders it when scraped).

Each figure is the median of ``--repeats`` timings of ``--steps`` steps; "off" runs the
same loops with nothing in them. The share is the counters' cost over a decode step of
``--step-ms`` milliseconds (default: 30 ms, the order of a tiny-model decode step on 2
CPU cores; pass yours).

Usage::

    python benchmarks/metrics_cost.py [--layers 48] [--stages 1] [--attention-ranks 1]
        [--steps 2000] [--repeats 7] [--step-ms 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from afd_core.metrics import Histogram, exposition
from afd_ffn.stats import FFNStats


def attention_counters(layers: int, stages: int) -> Callable[[], None]:
    """One step of the attention role's bookkeeping (see the module docstring)."""
    histogram = Histogram()
    state = {"wait": 0.0, "steps": 0, "two": 0}

    def step() -> None:
        for _layer in range(layers):
            for _stage in range(stages):
                sent_at = time.perf_counter()
                waiting_since = time.perf_counter()
                received_at = time.perf_counter()
                state["wait"] += received_at - waiting_since
                histogram.observe(received_at - sent_at)
        state["steps"] += 1
        state["two"] += stages == 2

    return step


def ffn_counters(layers: int, stages: int, attention_ranks: int) -> Callable[[], None]:
    """One step of the FFN role's bookkeeping (see the module docstring)."""
    stats = FFNStats()
    ranks = [str(r) for r in range(attention_ranks)]

    def step() -> None:
        for _layer in range(layers):
            for _stage in range(stages):
                received_at = time.perf_counter()
                stats.rows += 8
                stats.layer_exchanges += 1
                stats.busy_s += time.perf_counter() - received_at
        for key in ranks:
            stats.tokens += 8
            by_rank = stats.tokens_by_attention_rank
            if key in by_rank:
                by_rank[key] += 8
            else:
                stats.tokens_by_attention_rank = {**by_rank, key: 8}
        stats.stages += stages
        stats.two_stage_steps += stages == 2
        stats.steps += 1

    return step


def empty_loop(layers: int, stages: int) -> Callable[[], None]:
    """The same loops with nothing in them: the "off" baseline."""

    def step() -> None:
        for _layer in range(layers):
            for _stage in range(stages):
                pass

    return step


def seconds_per_call(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the seconds one of ``calls`` back-to-back calls takes."""
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        timings.append((time.perf_counter() - started) / calls)
    return statistics.median(timings)


def scrape_record(layers: int, stages: int) -> list[dict[str, object]]:
    """One attention and one FFN worker's records, as the status middleware gathers them."""
    histogram = Histogram()
    for i in range(layers * stages * 100):
        histogram.observe(1e-4 * (1 + i % 50))
    attention = {
        "steps": 100,
        "two_stage_steps": 0,
        "exchange_wait_s": 0.5,
        "rendezvous_s": 1.0,
        "exchange_seconds": histogram.as_dict(),
        "endpoint": {},
    }
    ffn = FFNStats(
        steps=100,
        layer_exchanges=100 * layers,
        tokens=800,
        rows=800 * layers,
        tokens_by_attention_rank={"0": 800},
    ).as_dict()
    return [
        {"role": "attention", "rank": 0, "stats": attention, "status": {}},
        {"role": "ffn", "rank": 0, "stats": ffn, "status": {}},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48, help="exchanging layers per step")
    parser.add_argument("--stages", type=int, choices=(1, 2), default=1)
    parser.add_argument("--attention-ranks", type=int, default=1, help="served by the FFN rank")
    parser.add_argument("--steps", type=int, default=2000, help="steps per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per figure (median)")
    parser.add_argument("--step-ms", type=float, default=30.0, help="a decode step, for the share")
    args = parser.parse_args()

    off = seconds_per_call(empty_loop(args.layers, args.stages), args.steps, args.repeats)
    rows = []
    for role, counters in (
        ("attention", attention_counters(args.layers, args.stages)),
        ("FFN", ffn_counters(args.layers, args.stages, args.attention_ranks)),
    ):
        on = seconds_per_call(counters, args.steps, args.repeats)
        rows.append((role, on, off))
    records = scrape_record(args.layers, args.stages)
    scrape = seconds_per_call(lambda: exposition(records), 50, args.repeats)

    print(
        f"{args.layers} layers x {args.stages} stage(s) per step, {args.attention_ranks} "
        f"attention rank(s) per FFN rank; median of {args.repeats} x {args.steps} steps"
    )
    header = f"{'role':>9} | {'on us/step':>10} | {'off us/step':>11} | {'counters us/step':>16}"
    print(f"{header} | {'per layer ns':>12} | share of a {args.step_ms:g} ms step")
    for role, on, off_s in rows:
        cost = on - off_s
        per_layer = cost / (args.layers * args.stages) * 1e9
        share = cost / (args.step_ms / 1e3)
        print(
            f"{role:>9} | {on * 1e6:10.2f} | {off_s * 1e6:11.2f} | {cost * 1e6:16.2f} | "
            f"{per_layer:12.1f} | {share:.4%}"
        )
    print(
        f"one /metrics rendering of both roles' afd: families: {scrape * 1e6:.0f} us "
        "(when scraped; not per step)"
    )


if __name__ == "__main__":
    main()
