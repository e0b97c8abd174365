"""The per-role profiler on real servers: one trace per role and rank, with the AFD ranges.

A 1A1F deployment with two stages for prefills and one for decodes, whose servers both
run vLLM's ``--profiler-config`` (torch profiler); ``afd profile`` frames one
wall-clock window over both while requests decode; the deployment then shuts down
cleanly and each role's trace must be complete (readable JSON) and hold that role's
AFD exchange ranges, the attention's from the engine thread (one-stage steps) and from
the stage threads (two-stage steps). Both servers' ``/metrics`` hold vLLM's families and
AFD's, with counts that agree with the workers' ``afd_stats``.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.cli import main as afd_main
from afd_core.tools.launch import DeploymentSpec, LocalDeployment
from afd_core.workers.profiling import (
    ATTENTION_BEGIN,
    ATTENTION_SEND,
    ATTENTION_WAIT,
    FFN_COMPUTE,
    FFN_RECV,
    FFN_SEND,
    FFN_STEP,
    FFN_WAIT_STEP,
)
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import complete

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-moe"
WINDOW_S = 2.0
#: Two stages for a step that holds a prefill (the four prompts' tens of tokens), one for
#: the four-token decode steps.
STAGES = {"num_stages": 2, "stage_prefill_token_threshold": 2, "stage_decode_token_threshold": 64}
#: vLLM's profiler settings for both roles: no Python stacks (vLLM's default records one
#: per op, which makes a CPU trace of a few seconds take minutes to write), no API-server
#: trace, plain JSON.
PROFILER_CONFIG = {
    "profiler": "torch",
    "torch_profiler_with_stack": False,
    "torch_profiler_use_gzip": False,
    "ignore_frontend": True,
}


def trace_events(path: Path) -> list[dict[str, Any]]:
    """The events of one torch profiler trace (``.json`` or ``.json.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return list(json.load(f)["traceEvents"])


def range_names(events: list[dict[str, Any]]) -> set[str]:
    """Names of the AFD ranges in ``events``, without their ``.L<layer>`` suffix."""
    names = {str(e.get("name", "")) for e in events}
    return {name.rsplit(".L", 1)[0] for name in names if name.startswith("afd.")}


def range_threads(events: list[dict[str, Any]], name: str) -> set[Any]:
    """The threads (trace ``tid``) that recorded range ``name`` (any layer)."""
    return {e.get("tid") for e in events if str(e.get("name", "")).rsplit(".L", 1)[0] == name}


def test_a_profiled_1a1f_window_writes_one_trace_per_role_with_the_afd_ranges(
    tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    traces = tmp_path / "traces"
    profiler = PROFILER_CONFIG | {"torch_profiler_dir": str(traces)}
    spec = DeploymentSpec(
        model=tiny_models / MODEL,
        extra_args=("--profiler-config", json.dumps(profiler)),
        **STAGES,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        urls = [server.url for server in deployment.servers]
        stop = threading.Event()
        decoded: list[int] = []

        def decode() -> None:  # steps before, inside and after the window
            while not stop.is_set():
                decoded.append(len(complete(deployment.endpoint, PROMPTS, 8)))

        load = threading.Thread(target=decode)
        load.start()
        try:
            time.sleep(1.0)
            status = afd_main(["profile", *urls, "--seconds", str(WINDOW_S)])
        finally:
            stop.set()
            load.join(timeout=300)
        assert status == 0 and decoded
        (attention_server,) = deployment.attention_servers
        (ffn_server,) = deployment.ffn_servers
        attention_metrics = scrape(attention_server.url)
        ffn_metrics = scrape(ffn_server.url)
        (ffn_stats,) = deployment.ffn_stats()
    files = sorted(p.name for p in traces.iterdir())
    attention = [p for p in traces.glob("afd-attention0*.pt.trace.json*")]
    ffn = [p for p in traces.glob("afd-ffn0*.pt.trace.json*")]
    assert len(attention) == 1 and len(ffn) == 1, files
    attention_events = trace_events(attention[0])
    attention_ranges = range_names(attention_events)
    ffn_ranges = range_names(trace_events(ffn[0]))
    print(f"attention ranges {sorted(attention_ranges)}; FFN ranges {sorted(ffn_ranges)}")
    assert {ATTENTION_BEGIN, ATTENTION_SEND, ATTENTION_WAIT} <= attention_ranges
    assert {FFN_STEP, FFN_RECV, FFN_COMPUTE, FFN_SEND, FFN_WAIT_STEP} <= ffn_ranges
    assert not attention_ranges & {FFN_STEP, FFN_COMPUTE}, "an FFN range in the attention trace"
    engine = range_threads(attention_events, ATTENTION_BEGIN)
    senders = range_threads(attention_events, ATTENTION_SEND)
    print(f"threads: step begins {sorted(map(str, engine))}, sends {sorted(map(str, senders))}")
    assert len(engine) == 1, "every step begins on the engine thread"
    assert engine < senders, "no one-stage step's exchange in the trace"
    assert senders - engine, "no stage thread's exchange in the trace (two-stage steps)"
    # /metrics: vLLM's own families and AFD's, with the counters the workers report.
    assert any(name.startswith("vllm:") for name, _ in attention_metrics)
    rank0 = ("attention", "0", "0")
    steps = attention_metrics[("afd:attention_steps_total", rank0)]
    two_stage = attention_metrics[("afd:attention_two_stage_steps_total", rank0)]
    assert 0 < two_stage < steps, (two_stage, steps)
    assert attention_metrics[("afd:ready", rank0)] == 1
    exchanges = attention_metrics[("afd:attention_exchange_seconds_count", rank0)]
    assert (
        exchanges >= steps and attention_metrics[("afd:attention_exchange_seconds_sum", rank0)] > 0
    )
    ffn0 = ("ffn", "0", "0")
    ffn_steps = ffn_metrics[("afd:ffn_steps_total", ffn0)]
    assert 0 < ffn_steps <= ffn_stats["steps"], (ffn_steps, ffn_stats)
    # One attention rank: its tokens are all the FFN rank's (one snapshot per scrape).
    by_rank = ffn_metrics[("afd:ffn_attention_rank_tokens_total", ffn0)]
    assert 0 < by_rank == ffn_metrics[("afd:ffn_tokens_total", ffn0)] <= ffn_stats["tokens"]
    assert ffn_metrics[("afd:ffn_linked_attention_ranks", ffn0)] == 1
    assert ffn_metrics[("afd:scrape_ok", ())] == 1
    assert ffn_metrics[("afd:ffn_rendezvous_total", ffn0)] == 1
    assert ffn_metrics[("afd:ffn_rendezvous_seconds_total", ffn0)] > 0
    assert attention_metrics[("afd:attention_rendezvous_seconds", rank0)] > 0


def scrape(url: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """``GET /metrics`` of a server: each sample by its name and its (role, rank, worker)
    labels (empty where it has none of them)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(s.labels[k] for k in ("role", "rank", "worker") if k in s.labels)): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
