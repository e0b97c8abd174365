"""AFD's Prometheus metrics: the ``afd:`` families appended to a server's ``/metrics``.

The counters already exist in the role workers (``afd_stats``: the attention session's
and the FFN server's); nothing on the hot path changes for metrics. At each scrape the
status middleware (:class:`afd_core.http_status.AFDStatusMiddleware`) asks every worker
of the server for ``afd_stats`` and ``afd_status`` and appends :func:`exposition` of
their answers to vLLM's own ``/metrics`` text. Every sample carries the labels ``role``
(``attention`` or ``ffn``), ``rank`` (the role rank) and ``worker`` (the worker's index in
its server: 0, or the TP rank of an attention server with tensor parallelism). The
families, their meaning and their PromQL use are in ``docs/metrics.md``;
:data:`FAMILIES` is the one list.

``prometheus_client`` (a vLLM dependency) is imported only when text is built.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "afd:"
#: Upper bounds (seconds) of the exchange-time buckets: one layer's exchange, from tens of
#: microseconds (gloo on one host) to a tenth of a second.
EXCHANGE_SECONDS_BOUNDS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
)  # fmt: skip


class Histogram:
    """Counts of observations by bucket, cheap enough for a per-layer call: one
    ``bisect`` and two additions per :meth:`observe` (no lock: one thread observes at a
    time, readers see counts at most one observation behind)."""

    def __init__(self, bounds: tuple[float, ...] = EXCHANGE_SECONDS_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def as_dict(self) -> dict[str, Any]:
        """``{"bounds", "counts", "sum"}`` as plain JSON values (``counts`` per bucket,
        not cumulative; one more than ``bounds``)."""
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}


@dataclass(frozen=True)
class Family:
    """One metric family: its name (without :data:`PREFIX`), ``"counter"``, ``"gauge"``
    or ``"histogram"`` (its key holds :meth:`Histogram.as_dict`), the role it belongs
    to, the ``afd_stats`` key (dotted for nested records, e.g.
    ``"endpoint.attention_replacements"``) and its help text. With ``by``, the key holds
    a mapping and every entry is a sample with one more label, ``by``, set to its key."""

    name: str
    kind: str
    role: str
    key: str
    help: str
    by: str | None = None


FAMILIES: tuple[Family, ...] = (
    Family("attention_steps", "counter", "attention", "steps",
           "Steps (forwards) this attention rank completed through the FFN role"),
    Family("attention_two_stage_steps", "counter", "attention", "two_stage_steps",
           "Steps run as two micro-batch stages"),
    Family("attention_exchange_wait_seconds", "counter", "attention", "exchange_wait_s",
           "Seconds the attention rank waited for FFN results"),
    Family("attention_exchange_seconds", "histogram", "attention", "exchange_seconds",
           "One layer's exchange, from its send to its FFN result received (eager steps; "
           "with two stages the other stage's turn included)"),
    Family("ffn_steps", "counter", "ffn", "steps", "Steps the FFN rank served"),
    Family("ffn_stages", "counter", "ffn", "stages",
           "Stages of the steps served (a two-stage step counts 2)"),
    Family("ffn_two_stage_steps", "counter", "ffn", "two_stage_steps",
           "Steps served as two stages"),
    Family("ffn_layer_exchanges", "counter", "ffn", "layer_exchanges",
           "(layer, stage) batches computed and sent back"),
    Family("ffn_tokens", "counter", "ffn", "tokens", "Tokens of the steps served"),
    Family("ffn_attention_rank_tokens", "counter", "ffn", "tokens_by_attention_rank",
           "Tokens of the steps served, by the attention rank that sent them",
           by="attention_rank"),
    Family("ffn_rows", "counter", "ffn", "rows",
           "Rows computed over all eager layer exchanges (a token once per layer)"),
    Family("ffn_busy_seconds", "counter", "ffn", "busy_s",
           "Seconds from each layer batch received to its result sent; its rate is the "
           "FFN rank's busy fraction"),
    Family("ffn_work_items", "counter", "ffn", "work_items",
           "Work items served (in-band connectors, which have no steps)"),
    Family("ffn_graph_replays", "counter", "ffn", "graph_replays",
           "Graph steps served by replaying a captured CUDA graph"),
    Family("ffn_rendezvous", "counter", "ffn", "rendezvous", "Rendezvous completed"),
    Family("ffn_rendezvous_seconds", "counter", "ffn", "rendezvous_s",
           "Seconds spent in the rendezvous completed"),
    Family("attention_rendezvous_seconds", "gauge", "attention", "rendezvous_s",
           "Seconds the attention rank's rendezvous with the FFN role took"),
    Family("ffn_attention_replacements", "counter", "ffn", "endpoint.attention_replacements",
           "Attention servers that took the seat of one that left"),
    Family("ffn_linked_attention_ranks", "gauge", "ffn", "status.linked_attention_ranks",
           "Attention ranks linked now"),
    Family("ready", "gauge", "any", "status.ready",
           "1 while the worker is ready (GET /afd/status), else 0"),
)  # fmt: skip


def _value(record: Mapping[str, Any], key: str) -> float | None:
    """The number at dotted ``key`` of ``record`` (a list counts its items; a bool is 0
    or 1); None when absent."""
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, list | tuple):
        return float(len(value))
    if isinstance(value, bool | int | float):
        return float(value)
    return None


def _entries(record: Mapping[str, Any], key: str) -> list[tuple[str, float]]:
    """The ``(label, number)`` entries of the mapping at ``key`` (none when absent)."""
    value = record.get(key)
    if not isinstance(value, Mapping):
        return []
    return [(str(k), float(v)) for k, v in sorted(value.items()) if isinstance(v, int | float)]


def _histogram(record: Mapping[str, Any], key: str) -> tuple[list[tuple[str, float]], float] | None:
    """The cumulative ``(le, count)`` buckets and the sum of the histogram at ``key``."""
    value = record.get(key)
    if not isinstance(value, Mapping) or "counts" not in value:
        return None
    buckets, total = [], 0
    bounds = [*(repr(float(b)) for b in value["bounds"]), "+Inf"]
    for bound, count in zip(bounds, value["counts"], strict=True):
        total += int(count)
        buckets.append((bound, float(total)))
    return buckets, float(value["sum"])


def exposition(workers: Iterable[Mapping[str, Any]] | None) -> str:
    """The Prometheus text of the ``afd:`` families for ``workers``: one record per worker,
    ``{"role", "rank", "stats", "status"}`` (``stats`` the worker's ``afd_stats``,
    ``status`` its ``afd_status``; either may be {}). A family gets a sample for every
    worker of its role whose record has the key; families without samples are left out.
    ``afd:scrape_ok`` is 1, or 0 with no other family when ``workers`` is None (the
    workers did not answer).
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    KINDS = {
        "counter": CounterMetricFamily,
        "gauge": GaugeMetricFamily,
        "histogram": HistogramMetricFamily,
    }

    records = None if workers is None else list(workers)

    class _Snapshot:
        def collect(self) -> Iterable[Any]:
            ok = GaugeMetricFamily(
                PREFIX + "scrape_ok", "1 when every worker answered this scrape, else 0"
            )
            ok.add_metric((), 0.0 if records is None else 1.0)
            yield ok
            for family in FAMILIES if records is not None else ():
                kind = KINDS[family.kind]
                labels = ("role", "rank", "worker", *((family.by,) if family.by else ()))
                metric = kind(PREFIX + family.name, family.help, labels=labels)
                samples = 0
                for index, w in enumerate(records or ()):
                    if family.role not in ("any", w["role"]):
                        continue
                    record = {**w["stats"], "status": w["status"]}
                    names = (str(w["role"]), str(w["rank"]), str(index))
                    if family.kind == "histogram":
                        histogram = _histogram(record, family.key)
                        if histogram is not None:
                            metric.add_metric(names, *histogram)
                            samples += 1
                        continue
                    if family.by is not None:
                        for key, value in _entries(record, family.key):
                            metric.add_metric((*names, key), value)
                            samples += 1
                        continue
                    value = _value(record, family.key)
                    if value is not None:
                        metric.add_metric(names, value)
                        samples += 1
                if samples:
                    yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot())  # type: ignore[arg-type]
    return generate_latest(registry).decode()
