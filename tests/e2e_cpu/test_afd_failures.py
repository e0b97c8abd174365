"""AFD deployments fail loudly and promptly: mismatched peers, a peer that stops or freezes.

Real vLLM servers over ``P2pGlooAFDConnector`` (the mismatch and stopped-peer cases over
each connector of :data:`CONNECTORS`, the stopped-peer case also over
``CAMAsyncAFDConnector``, which has no control plane; CI runs them over
``P2pGlooAFDConnector``, the others carry the ``extended`` mark); every wait is bounded by a short
``afd_process_group_timeout_s`` so that a hang would fail the test, not stall CI. Each
test starts its own servers, since it stops or breaks them. The replacement of an idle
attention server after SIGKILL, of one of two expert-routed attention servers (2A2F)
and the attention server's SIGTERM at the rendezvous carry the ``extended`` mark
(``nox -s e2e_extended``); CI replaces one after SIGTERM mid-stream, and one of two P2P
attention servers.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)
from afd_core.tools.launch.deployment import DEFAULT_CONNECTOR
from afd_core.workers.process_exit import EXIT_GRACE_S
from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import MonolithicServers, complete

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-moe"
#: The connectors the mismatch and stopped-peer tests run over.
CONNECTORS = [DEFAULT_CONNECTOR, "CAMP2pAFDConnector"]
PEER_TIMEOUT_S = 30
#: Server start (imports, engine init) plus the rendezvous timeout, with room to spare.
EXIT_DEADLINE_S = 150.0


def afd_server(
    role: str,
    model: Path,
    work_dir: Path,
    cache_root: Path,
    port: int,
    connector_port: int,
    num_attention_ranks: int = 1,
    connector: str = DEFAULT_CONNECTOR,
) -> VllmServer:
    """One server of a hand-made AFD deployment (so the roles can disagree)."""
    config = {
        "afd": {
            "role": role,
            "connector": connector,
            "host": "127.0.0.1",
            "port": connector_port,
            "num_attention_ranks": num_attention_ranks,
            "num_ffn_ranks": 1,
            "afd_process_group_timeout_s": PEER_TIMEOUT_S,
        }
    }
    spec = ServerSpec(
        name=f"{role}-0",
        model=model,
        port=port,
        additional_config=config,
        dev_mode=role == "ffn",
    )
    return VllmServer(spec, work_dir, cache_root)


def wait_exit(server: VllmServer, deadline_s: float) -> float:
    """Seconds until ``server``'s API process exits; fails the test past the deadline."""
    end = time.monotonic() + deadline_s
    while server.running:
        if time.monotonic() > end:
            pytest.fail(f"{server.spec.name} still running after {deadline_s:.0f} s")
        time.sleep(0.5)
    return server.seconds_since_start()


@pytest.mark.parametrize(
    "connector",
    [DEFAULT_CONNECTOR, pytest.param("CAMP2pAFDConnector", marks=pytest.mark.extended)],
)
def test_mismatched_attention_rank_counts_fail_both_roles_at_start(
    connector: str, tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    model = tiny_models / MODEL
    connector_port, ffn_port, attention_port = free_ports(3)
    ffn = afd_server(
        "ffn",
        model,
        tmp_path,
        vllm_cache_root,
        ffn_port,
        connector_port,
        num_attention_ranks=2,
        connector=connector,
    )
    attention = afd_server(
        "attention",
        model,
        tmp_path,
        vllm_cache_root,
        attention_port,
        connector_port,
        num_attention_ranks=1,
        connector=connector,
    )
    try:
        ffn.start()
        attention.start()
        for server in (ffn, attention):
            wait_exit(server, EXIT_DEADLINE_S)
        for server in (ffn, attention):
            log = server.log_path.read_text(errors="replace")
            assert "num_attention_ranks" in log, server.log_tail()
            assert "AFDProtocolError" in log or "AFD rendezvous" in log, server.log_tail()
    finally:
        ffn.stop()
        attention.stop()


@pytest.mark.parametrize(
    "connector",
    [
        DEFAULT_CONNECTOR,
        *(pytest.param(c, marks=pytest.mark.extended) for c in CONNECTORS[1:]),
        pytest.param("CAMAsyncAFDConnector", marks=pytest.mark.extended),
    ],
)
@pytest.mark.parametrize("stopped_role", ["ffn"])
def test_stopping_one_role_ends_the_other_roles_waits_with_a_clear_error(
    stopped_role: str, connector: str, tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    in_band = connector == "CAMAsyncAFDConnector"  # no control plane: async DP, gate on attention
    spec = DeploymentSpec(
        model=tiny_models / MODEL,
        connector=connector,
        async_dp=in_band,
        compute_gate_on_attention=in_band,
    )
    deployment = LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root)
    with deployment:
        # The deployment serves before anything is stopped.
        assert complete(deployment.endpoint, PROMPTS[:1], 4)[0].token_ids
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        stopped, survivor = (ffn, attention) if stopped_role == "ffn" else (attention, ffn)
        outcome: list[object] = []
        if stopped_role == "ffn":
            # A request that may still be decoding when FFN stops (or may have finished:
            # a tiny model decodes fast); either way it must end, in an error or complete.
            request = threading.Thread(target=request_outcome, args=(attention.url, outcome))
            request.start()
            time.sleep(0.5)
        stopped.stop()
        # The survivor notices the lost peer and exits with the AFD error in its log.
        took = wait_exit(survivor, EXIT_DEADLINE_S)
        log = survivor.log_path.read_text(errors="replace")
        assert "AFDPeerError" in log or "closed the connection" in log, survivor.log_tail()
        # It ended because of a failure: a supervisor must see a non-zero status.
        assert survivor.exit_status == 1, survivor.log_tail()
        assert "this server ended because of a failure" in log, survivor.log_tail()
        if stopped_role == "ffn":
            request.join(timeout=60)
            assert not request.is_alive(), "the in-flight request still hangs"
            (result,) = outcome
            if not isinstance(result, BaseException):  # it finished before FFN left
                assert all(len(c.token_ids) == REQUEST_TOKENS for c in result), result
        print(f"{survivor.spec.name} exited {took:.1f} s after start")


#: Tokens per prompt of the request in flight while a role stops.
REQUEST_TOKENS = 200


def request_outcome(url: str, outcome: list[object]) -> None:
    """Append the completions of a long request on ``url``, or the error it ended with."""
    try:
        outcome.append(complete(url, PROMPTS, REQUEST_TOKENS, timeout_s=90.0))
    except BaseException as exc:
        outcome.append(exc)


@dataclass(frozen=True)
class StreamOutcome:
    """How a streamed request ended: chunks received, when it was interrupted (monotonic
    time; 0.0 when it ended before), and the error it ended with, if any."""

    chunks: int
    interrupted_at: float
    failure: Exception | None


def stream_and_interrupt(
    url: str,
    interrupt: Callable[[], None],
    after_chunks: int,
    timeout_s: float,
    on_chunk: Callable[[int], None] = lambda chunks: None,
) -> StreamOutcome:
    """Stream a long greedy completion from ``url`` and call ``interrupt`` once
    ``after_chunks`` chunks have arrived (``on_chunk`` gets the count after every chunk).
    The stream must end (an error or its end), never hang: the client's ``timeout_s``
    bounds it."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=timeout_s, max_retries=0)
    chunks, interrupted_at, failure = 0, 0.0, None
    try:
        stream = client.completions.create(
            model=client.models.list().data[0].id,
            prompt=PROMPTS[0],
            max_tokens=REQUEST_TOKENS,
            temperature=0.0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for _ in stream:
            chunks += 1
            on_chunk(chunks)
            if chunks == after_chunks:
                interrupt()
                interrupted_at = time.monotonic()
    except Exception as exc:  # the server went away mid-stream, as asked
        failure = exc
    finally:
        client.close()
    return StreamOutcome(chunks, interrupted_at, failure)


def test_a_frozen_ffn_fails_the_streaming_request_in_flight_within_seconds(
    tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    """SIGSTOP of the whole FFN server while a request streams: the request cannot finish
    (every step needs the FFN rank), and the attention rank's peer watch, not the 30 s
    transport timeout, ends it: 5 s of silence, then the attention server exits."""
    spec = DeploymentSpec(model=tiny_models / MODEL, afd_process_group_timeout_s=PEER_TIMEOUT_S)
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        # Once the request is in flight, freeze every FFN process.
        stream = stream_and_interrupt(
            attention.url, lambda: os.killpg(ffn.pid, signal.SIGSTOP), 1, timeout_s=90.0
        )
        frozen_at, failure, chunks = stream.interrupted_at, stream.failure, stream.chunks
        failed_after = time.monotonic() - frozen_at
        took = wait_exit(attention, EXIT_DEADLINE_S)
        log = attention.log_path.read_text(errors="replace")
        ffn.stop(grace_s=0.0)  # SIGKILL at once: a stopped process ignores SIGTERM
    assert frozen_at, "the stream ended before its first chunk"
    assert chunks < REQUEST_TOKENS, f"the request finished ({chunks} chunks) with FFN frozen"
    # An exception, or a stream cut short without its last tokens: never a hang.
    print(f"stream ended after {chunks} chunks, {failed_after:.1f} s after the freeze: {failure!r}")
    assert "sent no heartbeat for 5 s" in log, attention.log_tail()
    assert failed_after < PEER_TIMEOUT_S, "the request ended only at the transport timeout"
    print(f"attention exited {took:.1f} s after start")


#: Requests streamed at once in the two-stage failure test: every decode step splits.
TWO_STAGE_STREAMS = 4
#: Seconds the two-stage failure test waits for split steps with requests in flight.
TWO_STAGE_WAIT_S = 60.0
#: A stream this many tokens short of its end at the kill cannot have been served whole
#: before it (the server runs ahead of a client by a few buffered chunks, not this many).
IN_FLIGHT_MARGIN = 50


def mid_way(progress: list[int]) -> list[int]:
    """The streams (indices into ``progress``, chunks received) that have started and are
    at least :data:`IN_FLIGHT_MARGIN` chunks from their end."""
    return [i for i, n in enumerate(progress) if 0 < n <= REQUEST_TOKENS - IN_FLIGHT_MARGIN]


def test_an_ffn_killed_during_two_stage_steps_ends_every_request_within_seconds(
    tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    """Two stages per step (thresholds 2), four requests streaming, so decode steps run
    as two stages on the attention rank's stage threads: SIGKILL of the whole FFN server
    once steps have split and at least two requests are mid-stream. The stage waiting
    for the FFN rank's answer fails with the connector's error naming FFN rank 0, the
    step ends (the other stage is unwound, no wait outlives the peer watch), every
    request in flight at the kill ends short within seconds, and the attention server
    exits with that error in its log. A stream that finished before the kill (the
    streams start at different times) proves nothing and is not counted."""
    spec = DeploymentSpec(
        model=tiny_models / MODEL,
        afd_process_group_timeout_s=PEER_TIMEOUT_S,
        num_stages=2,
        stage_decode_token_threshold=2,
        stage_prefill_token_threshold=2,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        progress = [0] * TWO_STAGE_STREAMS  # chunks each stream has received so far
        at_kill: list[int] = []  # progress when the kill fired
        split_steps: list[int] = []
        killed_at: list[float] = []

        def kill_ffn() -> None:
            deadline = time.monotonic() + TWO_STAGE_WAIT_S
            while True:
                (stats,) = deployment.attention_stats()
                snapshot = list(progress)
                split = stats["two_stage_steps"] > 0 and len(mid_way(snapshot)) >= 2
                if split or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            split_steps.append(stats["two_stage_steps"])
            at_kill.extend(snapshot)
            os.killpg(ffn.pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

        outcomes: dict[int, StreamOutcome] = {}
        ended_at: list[float] = []

        def stream(index: int) -> None:
            def count(chunks: int) -> None:
                progress[index] = chunks

            outcomes[index] = stream_and_interrupt(
                attention.url, lambda: None, 0, timeout_s=90.0, on_chunk=count
            )
            ended_at.append(time.monotonic())

        killer = threading.Thread(target=kill_ffn)
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(TWO_STAGE_STREAMS)]
        for thread in [*threads, killer]:
            thread.start()
        for thread in [killer, *threads]:
            thread.join(120.0)
        took = wait_exit(attention, EXIT_DEADLINE_S)
        log = attention.log_path.read_text(errors="replace")
    assert killed_at and split_steps[0] > 0, f"no split step before the kill: {split_steps}"
    assert len(outcomes) == TWO_STAGE_STREAMS  # every stream ended: no thread hangs
    in_flight = mid_way(at_kill)
    assert len(in_flight) >= 2, f"fewer than two streams mid-way at the kill: {at_kill}"
    ended = {i: outcomes[i].chunks for i in in_flight}
    assert all(n < REQUEST_TOKENS for n in ended.values()), f"at the kill {at_kill}, {ended}"
    slowest = max(ended_at) - killed_at[0]
    print(f"two-stage steps before the kill: {split_steps[0]}; chunks at the kill {at_kill}")
    print(f"last stream ended {slowest:.1f} s after the kill")
    assert slowest < SIGNAL_BOUND_S, "a request outlived the peer watch's bound"
    assert "FFN rank 0 (world rank 0)" in log and "AFDPeerError" in log, attention.log_tail()
    print(f"attention exited {took:.1f} s after start")


def wait_tree_gone(server: VllmServer, since: float, bound_s: float) -> float:
    """Seconds from ``since`` until no process of ``server`` is left; fails past the bound."""
    while left := server.leftover_pids():
        if time.monotonic() - since > bound_s:
            pytest.fail(f"{server.spec.name}: {left} still run {bound_s:.0f} s after it ended")
        time.sleep(0.2)
    return time.monotonic() - since


@pytest.mark.parametrize("killed_role", ["ffn"])
def test_killing_an_api_server_ends_its_engine_and_workers_within_seconds(
    killed_role: str, tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    """``kill -9`` of one role's API server process: vLLM leaves its engine and worker
    running; AFD's frontend watch ends them (and so their connector), and the other role
    then ends with a failure (non-zero status)."""
    spec = DeploymentSpec(model=tiny_models / MODEL, afd_process_group_timeout_s=PEER_TIMEOUT_S)
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        assert complete(deployment.endpoint, PROMPTS[:1], 4)[0].token_ids
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        killed, survivor = (attention, ffn) if killed_role == "attention" else (ffn, attention)
        assert killed.pid is not None
        descendants = killed.leftover_pids()
        assert len(descendants) >= 3, descendants  # API server, engine core, worker
        os.kill(killed.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        bound = EXIT_GRACE_S + 5.0  # the watch sees the end at once; then vLLM's exit
        gone_after = wait_tree_gone(killed, killed_at, bound)
        wait_exit(survivor, EXIT_DEADLINE_S)
        log = survivor.log_path.read_text(errors="replace")
    print(f"{killed.spec.name}'s processes gone {gone_after:.1f} s after kill -9 of its API server")
    assert survivor.exit_status == 1, log[-3000:]


@pytest.mark.parametrize(
    ("how", "when"),
    [
        pytest.param("SIGTERM", "mid-stream", id="SIGTERM-mid-stream"),
        pytest.param("SIGKILL", "idle", id="SIGKILL-idle", marks=pytest.mark.extended),
    ],
)
def test_an_attention_server_can_be_replaced_against_a_running_ffn(
    how: str,
    when: str,
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
) -> None:
    """The attention server's API process gets SIGTERM while it streams, or SIGKILL while
    it idles: its whole tree ends within seconds; the FFN server keeps its model, stays
    healthy, and serves a new attention server of the same config at a new rendezvous,
    whose tokens equal monolithic vLLM's."""
    model = tiny_models / MODEL
    reference = complete(monolithic_servers.get(model).url, PROMPTS, REPLACEMENT_TOKENS)
    spec = DeploymentSpec(model=model, afd_process_group_timeout_s=PEER_TIMEOUT_S)
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        (attention,) = deployment.attention_servers
        (ffn,) = deployment.ffn_servers
        assert complete(attention.url, PROMPTS[:1], 4)[0].token_ids
        assert attention.pid is not None
        serving = ffn_status(ffn)
        assert attention.afd_status()[0] == 200
        sig = getattr(signal, how)
        if when == "mid-stream":
            pid = attention.pid
            stream = stream_and_interrupt(attention.url, lambda: os.kill(pid, sig), 3, 60.0)
            stopped_at = stream.interrupted_at
            assert stopped_at, f"the stream ended after {stream.chunks} chunks, before the signal"
            assert stream.chunks < REQUEST_TOKENS
        else:
            stopped_at = time.monotonic()
            os.kill(attention.pid, sig)
        took = wait_tree_gone(attention, stopped_at, SIGNAL_BOUND_S)
        time.sleep(2.0)  # the FFN rank has seen the attention rank go and reopened
        assert ffn.running and ffn.is_healthy(), ffn.log_tail()
        waiting = ffn_status(ffn)
        replacement = VllmServer(attention.spec, tmp_path / "replacement", vllm_cache_root)
        with replacement:
            replacement.wait_healthy(time.monotonic() + EXIT_DEADLINE_S)
            afd = complete(replacement.url, PROMPTS, REPLACEMENT_TOKENS)
            (stats,) = deployment.ffn_stats()
            replaced = ffn_status(ffn)
        log = ffn.log_path.read_text(errors="replace")
    print(f"attention tree gone {took:.1f} s after {how} ({when})")
    assert [c.token_ids for c in afd] == [c.token_ids for c in reference]
    # The FFN rank took the new server in on its running connector: no second rendezvous.
    assert stats["rendezvous"] == 1 and stats["endpoint"]["attention_replacements"] == 1, stats
    assert "waits up to" in log and "new attention ranks joined" in log
    # GET /afd/status follows the FFN rank: ready, not ready without its attention rank
    # (HTTP 503 while /health stays 200), ready again with the replacement.
    assert serving[0] == 200 and serving[1]["linked_attention_ranks"] == [0], serving
    assert serving[1]["state"] == "serving" and serving[1]["last_peer_loss"] is None, serving
    assert waiting[0] == 503 and waiting[1]["linked_attention_ranks"] == [], waiting
    assert "attention rank 0" in waiting[1]["last_peer_loss"]["error"], waiting
    assert replaced[0] == 200 and replaced[1]["linked_attention_ranks"] == [0], replaced
    assert replaced[1]["attention_replacements"] == 1 and replaced[1]["rendezvous"] == 1, replaced


def ffn_status(server: VllmServer) -> tuple[int, dict[str, Any]]:
    """``GET /afd/status`` of a one-worker FFN server: the HTTP status and its worker's
    record, checked against the server's own answer (ready iff every worker is)."""
    code, body = server.afd_status()
    (worker,) = body["workers"]
    assert worker["role"] == "ffn" and body["ready"] is worker["ready"], body
    assert (code == 200) is worker["ready"], body
    return code, worker


@pytest.mark.parametrize(
    ("connector", "num_ffn_ranks"),
    [
        pytest.param("P2pGlooAFDConnector", 1, id="p2p-2A1F"),
        pytest.param(
            "ExpertRoutedAFDConnector", 2, id="expert-routed-2A2F", marks=pytest.mark.extended
        ),
    ],
)
def test_replacing_one_attention_server_of_two_leaves_the_other_serving(
    connector: str,
    num_ffn_ranks: int,
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path: Path,
) -> None:
    """2A1F over P2P, 2A2F expert-routed (each FFN rank its own server): attention rank
    1's API process gets SIGTERM while rank 0 answers requests. Rank 1's tree ends; rank
    0 (the same process) keeps answering, every completion equal to monolithic vLLM's,
    before, during and after a new server takes rank 1's seat; the new server's
    completions equal monolithic vLLM's too, and every FFN server kept its first
    rendezvous."""
    model = tiny_models / MODEL
    reference = complete(monolithic_servers.get(model).url, PROMPTS, REPLACEMENT_TOKENS)
    expected = [c.token_ids for c in reference]
    spec = DeploymentSpec(
        model=model,
        num_attention_ranks=2,
        num_ffn_ranks=num_ffn_ranks,
        connector=connector,
        compute_gate_on_attention=connector == "ExpertRoutedAFDConnector",
        afd_process_group_timeout_s=PEER_TIMEOUT_S,
    )
    with LocalDeployment(spec, work_dir=tmp_path, cache_root=vllm_cache_root) as deployment:
        first, second = deployment.attention_servers
        ffn_servers = deployment.ffn_servers
        for server in (first, second):
            assert [c.token_ids for c in complete(server.url, PROMPTS, REPLACEMENT_TOKENS)] == (
                expected
            )
        first_pid, second_pid = first.pid, second.pid
        assert first_pid is not None and second_pid is not None
        answers: list[list[list[int]]] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def keep_asking() -> None:
            while not stop.is_set():
                try:
                    completions = complete(first.url, PROMPTS, REPLACEMENT_TOKENS)
                except BaseException as exc:
                    errors.append(exc)
                    return
                answers.append([c.token_ids for c in completions])

        asking = threading.Thread(target=keep_asking, daemon=True)
        asking.start()
        time.sleep(1.0)
        stopped_at = time.monotonic()
        os.kill(second_pid, signal.SIGTERM)
        took = wait_tree_gone(second, stopped_at, SIGNAL_BOUND_S)
        time.sleep(2.0)  # rank 0 keeps being served while rank 1's seat is empty
        replacement = VllmServer(second.spec, tmp_path / "replacement", vllm_cache_root)
        with replacement:
            replacement.wait_healthy(time.monotonic() + EXIT_DEADLINE_S)
            replaced = complete(replacement.url, PROMPTS, REPLACEMENT_TOKENS)
            time.sleep(1.0)
            stop.set()
            asking.join(60)
            all_stats = deployment.ffn_stats()
            assert first.running and first.pid == first_pid and first.is_healthy()
            for ffn in ffn_servers:
                assert ffn.running and ffn.is_healthy(), ffn.log_tail()
    print(
        f"{connector}: attention rank 1 gone {took:.1f} s after SIGTERM; rank 0 answered "
        f"{len(answers)} requests meanwhile"
    )
    assert not errors, errors
    assert len(answers) >= 3, answers
    assert all(tokens == expected for tokens in answers), answers
    assert [c.token_ids for c in replaced] == expected
    assert len(all_stats) == num_ffn_ranks
    for stats in all_stats:
        assert stats["rendezvous"] == 1, stats
        assert stats["endpoint"]["attention_replacements"] == 1, stats
        assert stats["endpoint"]["linked_attention_ranks"] == [0, 1], stats


#: The issue's bound for a signalled server's whole process tree to end.
SIGNAL_BOUND_S = 15.0


@pytest.mark.parametrize(
    ("role", "how", "target"),
    [
        ("ffn", "SIGTERM", "process"),
        ("attention", "SIGINT", "group"),
        pytest.param("attention", "SIGTERM", "process", marks=pytest.mark.extended),
    ],
)
def test_a_server_waiting_at_the_rendezvous_ends_on_a_signal(
    role: str, how: str, target: str, tiny_models: Path, vllm_cache_root: Path, tmp_path: Path
) -> None:
    """Only one role started, so it waits for its peers: the FFN server (healthy while it
    waits) gets SIGTERM on its API process, as a supervisor sends it; the attention
    server (its rendezvous runs inside vLLM's engine start-up) gets SIGINT on its process
    group, as Ctrl-C in a terminal sends it, or SIGTERM on its API process alone (which
    vLLM alone would act on only when its start-up wait ends: afd_core.workers.startup_signals).
    Either ends its whole tree within :data:`SIGNAL_BOUND_S`."""
    port, connector_port = free_ports(2)
    server = afd_server(role, tiny_models / MODEL, tmp_path, vllm_cache_root, port, connector_port)
    with server:
        deadline = time.monotonic() + EXIT_DEADLINE_S
        while "waiting for" not in server.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, server.log_tail()
            server.check_alive()
            time.sleep(0.5)
        assert server.pid is not None
        if role == "ffn":
            server.wait_healthy(deadline)
        signalled_at = time.monotonic()
        if target == "group":
            os.killpg(server.pid, getattr(signal, how))
        else:
            os.kill(server.pid, getattr(signal, how))
        took = wait_tree_gone(server, signalled_at, SIGNAL_BOUND_S)
    print(f"{role} tree gone {took:.1f} s after {how} at the rendezvous")


#: Tokens per prompt compared between the replacement attention server and monolithic vLLM.
REPLACEMENT_TOKENS = 8
