"""The ``afd:`` Prometheus families: built from workers' ``afd_stats``/``afd_status``, and
appended to vLLM's ``/metrics`` answer by the status middleware."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

prometheus = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from afd_core.http_status import METRICS_PATH, AFDStatusMiddleware  # noqa: E402
from afd_core.metrics import FAMILIES, Histogram, exposition  # noqa: E402

FFN = {
    "role": "ffn",
    "rank": 1,
    "stats": {"steps": 7, "busy_s": 0.25, "rendezvous": 1,
              "tokens_by_attention_rank": {"0": 40, "1": 24},
              "endpoint": {"attention_replacements": 2, "linked_attention_ranks": [0, 1]}},
    "status": {"ready": True, "linked_attention_ranks": [0, 1]},
}  # fmt: skip
ATTENTION = {
    "role": "attention",
    "rank": 0,
    "stats": {"steps": 9, "two_stage_steps": 4, "exchange_wait_s": 1.5, "endpoint": {}},
    "status": {"ready": True},
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``text`` by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(role: str, rank: int) -> tuple[tuple[str, str], ...]:
    return (("rank", str(rank)), ("role", role), ("worker", "0"))


def test_each_worker_gets_the_families_of_its_role_with_its_values():
    ffn = samples(exposition([FFN]))
    assert ffn[("afd:ffn_steps_total", labels("ffn", 1))] == 7
    assert ffn[("afd:ffn_busy_seconds_total", labels("ffn", 1))] == 0.25
    assert ffn[("afd:ffn_attention_replacements_total", labels("ffn", 1))] == 2
    assert ffn[("afd:ffn_linked_attention_ranks", labels("ffn", 1))] == 2
    assert ffn[("afd:ready", labels("ffn", 1))] == 1
    assert ffn[("afd:scrape_ok", ())] == 1
    for attention_rank, tokens in (("0", 40), ("1", 24)):
        by = tuple(sorted((*labels("ffn", 1), ("attention_rank", attention_rank))))
        assert ffn[("afd:ffn_attention_rank_tokens_total", by)] == tokens
    assert not any(name.startswith("afd:attention_") for name, _ in ffn)
    attention = samples(exposition([ATTENTION]))
    assert attention[("afd:attention_two_stage_steps_total", labels("attention", 0))] == 4
    assert attention[("afd:attention_exchange_wait_seconds_total", labels("attention", 0))] == 1.5
    assert not any(name.startswith("afd:ffn_") for name, _ in attention)


def test_no_answer_is_scrape_ok_0_alone():
    assert samples(exposition(None)) == {("afd:scrape_ok", ()): 0.0}


def test_every_family_is_named_once_with_the_prefix():
    names = [f.name for f in FAMILIES]
    kinds = {f.kind for f in FAMILIES}
    assert len(names) == len(set(names)) and kinds == {"counter", "gauge", "histogram"}


class Engine:
    async def collective_rpc(self, method: str) -> list[dict[str, Any]]:
        record = ATTENTION if method == "afd_stats" else {"role": "attention", "ready": True,
                                                           "attention_rank": 0}  # fmt: skip
        return [record["stats"] if method == "afd_stats" else record]


def scrape(status: int = 200) -> tuple[list[tuple[bytes, bytes]], dict[str, Any], bytes]:
    """One GET /metrics through the middleware over an inner app answering ``status``:
    (the headers the inner app saw, the start message, the body sent)."""
    seen: list[tuple[bytes, bytes]] = []
    vllm_text = b"vllm:num_requests_running 3.0\n"

    async def inner(scope, receive, send):
        seen.extend(scope["headers"])
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(vllm_text)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": vllm_text})

    sent: list[dict[str, Any]] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    app = SimpleNamespace(state=SimpleNamespace(engine_client=Engine()))
    scope = {"type": "http", "path": METRICS_PATH, "method": "GET", "app": app,
             "headers": [(b"accept-encoding", b"gzip"), (b"host", b"x")]}  # fmt: skip
    asyncio.run(AFDStatusMiddleware(inner)(scope, receive, send))
    start, body = sent
    return seen, start, body["body"]


def test_metrics_keep_vllms_text_and_append_afds():
    seen, start, body = scrape()
    assert seen == [(b"host", b"x")], "vLLM's handler must answer uncompressed"
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()
    text = body.decode()
    assert text.startswith("vllm:num_requests_running 3.0\n")
    assert samples(text)[("afd:attention_steps_total", labels("attention", 0))] == 9


def test_a_failed_metrics_answer_passes_unchanged():
    _, start, body = scrape(status=500)
    assert start["status"] == 500 and body == b"vllm:num_requests_running 3.0\n"


def test_a_histogram_counts_by_bucket_and_exposes_cumulative_buckets():
    histogram = Histogram((0.001, 0.01))
    for value in (0.0005, 0.001, 0.002, 0.5):
        histogram.observe(value)
    assert histogram.as_dict() == {"bounds": [0.001, 0.01], "counts": [2, 1, 1], "sum": 0.5035}
    record = dict(ATTENTION, stats={**ATTENTION["stats"], "exchange_seconds": histogram.as_dict()})
    found = samples(exposition([record]))
    name = "afd:attention_exchange_seconds"
    bucket = [(k, v) for (n, k), v in found.items() if n == f"{name}_bucket"]
    assert sorted((dict(k)["le"], v) for k, v in bucket) == [
        ("+Inf", 4.0), ("0.001", 2.0), ("0.01", 3.0)
    ]  # fmt: skip
    assert found[(f"{name}_count", labels("attention", 0))] == 4
    assert found[(f"{name}_sum", labels("attention", 0))] == pytest.approx(0.5035)
