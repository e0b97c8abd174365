"""P2pNcclAFDConnector between two processes on two GPUs (FFN on cuda:0, attention on cuda:1).

The FFN rank applies a known function (``hidden * 2 + layer``, plus the row sum of the
router logits when the gate runs on attention) on its GPU; the attention rank checks every
result exactly on its GPU. Inputs are small integers, exact in bf16. Every rank runs in a
spawned process (CUDA cannot be forked) with a hard timeout; all are killed at the end.
Uses the first two visible GPUs (``CUDA_VISIBLE_DEVICES`` chooses them). Skips unless two
CUDA devices are visible.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e_gpu.gpu_settings import cuda_device_count
from tests.e2e_gpu.spawned import Ranks, port, ranks

__all__ = ["port", "ranks"]  # fixtures

pytestmark = pytest.mark.skipif(
    cuda_device_count() < 2,
    reason="needs two CUDA devices (one per role: NCCL cannot pair two processes on one GPU)",
)

FFN_DEVICE, ATTENTION_DEVICE = 0, 1
LAYERS = 4
#: Token counts of the steps (0: a step in which this rank has no tokens).
STEP_TOKENS = (1, 8, 0, 37, 256, 3)


def wire(gate: bool) -> Any:
    from afd_core.connector import WireSpec

    if gate:  # layer 0 dense (no router logits), like DeepSeek's first layers
        return WireSpec(
            hidden_size=512,
            dtype="bfloat16",
            num_exchange_layers=LAYERS,
            router_logits_width=16,
            dense_layers=(0,),
        )
    return WireSpec(hidden_size=2048, dtype="bfloat16", num_exchange_layers=LAYERS)


def connect(role: str, port: int, device: int, gate: bool, timeout_s: int = 60) -> Any:
    import torch

    from afd_connectors_gpu.p2p_nccl import P2pNcclAFDConnector
    from afd_core.config import AFDConfig

    torch.cuda.set_device(device)
    config = AFDConfig(
        role=role,
        connector="P2pNcclAFDConnector",
        port=port,
        afd_process_group_timeout_s=timeout_s,
        compute_gate_on_attention=gate,
    )
    conn = P2pNcclAFDConnector(config, 0, wire(gate))
    conn.initialize()
    return conn


def ffn_function(hidden: Any, layer: int, logits: Any) -> Any:
    out = hidden * 2 + layer
    if logits is not None:
        out = out + logits.float().sum(-1, keepdim=True).to(out.dtype)
    return out


# Rank programs (run in spawned processes) ------------------------------------------------


def serve(port: int, gate: bool) -> dict[str, Any]:
    """FFN rank: serve every step; report where the tensors it received lived."""
    conn = connect("ffn", port, FFN_DEVICE, gate)
    devices, with_logits, tokens = set(), [], []
    try:
        for _ in STEP_TOKENS:
            step = conn.ffn.next_step()
            tokens.append(step.tokens[0][0])
            for layer in range(LAYERS):
                batch = conn.ffn.recv(step, layer, 0)
                devices.add(str(batch.hidden.device))
                with_logits.append(batch.router_logits is not None)
                conn.ffn.send(batch, ffn_function(batch.hidden, layer, batch.router_logits))
    finally:
        conn.close()
    return {"devices": sorted(devices), "with_logits": with_logits, "tokens": tokens}


def attend(port: int, gate: bool) -> dict[str, Any]:
    """Attention rank: every step and layer, check the result exactly; count exchanges."""
    import torch

    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    conn = connect("attention", port, ATTENTION_DEVICE, gate)
    spec, device = conn.wire, torch.device("cuda", ATTENTION_DEVICE)
    gen = torch.Generator(device=device).manual_seed(7)
    exchanges, mismatches, out_devices = 0, [], set()
    try:
        for step_id, n in enumerate(STEP_TOKENS):
            conn.attention.begin_step(ControlPayload(step_id, 0, (AFDDPMetadata(0, (n,)),)))
            for layer in range(LAYERS):
                hidden = torch.randint(
                    -50, 50, (n, spec.hidden_size), generator=gen, device=device
                ).to(torch.bfloat16)
                logits = None
                if spec.logits_width_at(layer):
                    logits = torch.randint(
                        -4, 4, (n, spec.router_logits_width), generator=gen, device=device
                    ).float()
                conn.attention.send(layer, 0, hidden, router_logits=logits)
                out = conn.attention.recv(layer, 0)
                out_devices.add(str(out.device))
                if not torch.equal(out, ffn_function(hidden, layer, logits)):
                    mismatches.append((step_id, layer))
                exchanges += 1
    finally:
        conn.close()
    return {"exchanges": exchanges, "mismatches": mismatches, "devices": sorted(out_devices)}


#: The layer order the FFN rank serves in the mispairing test (the attention rank sends
#: 0, 1, 2, 3): every message has the size the step announced, only the layers differ.
WRONG_ORDER = (1, 0, 2, 3)


def serve_wrong_layers(port: int) -> tuple[str, str]:
    """FFN rank: serve one step in :data:`WRONG_ORDER`; report the error of its check.

    Device headers are checked once per step, after its last message.
    """
    conn = connect("ffn", port, FFN_DEVICE, False, timeout_s=15)
    try:
        step = conn.ffn.next_step()
        for layer in WRONG_ORDER:
            batch = conn.ffn.recv(step, layer, 0)
            conn.ffn.send(batch, batch.hidden)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        conn.close()
    return "nothing", "a step of mispaired layers was accepted"


def attend_one_step(port: int) -> tuple[str, str]:
    """Attention rank: one step of every layer; report the error of its check."""
    import torch

    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    conn = connect("attention", port, ATTENTION_DEVICE, False, timeout_s=15)
    try:
        conn.attention.begin_step(ControlPayload(0, 0, (AFDDPMetadata(0, (4,)),)))
        hidden = torch.ones(4, conn.wire.hidden_size, dtype=torch.bfloat16, device="cuda")
        for layer in range(LAYERS):
            conn.attention.send(layer, 0, hidden)
            conn.attention.recv(layer, 0)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        conn.close()
    return "nothing", "replies of mispaired layers were accepted"


#: Graph-step plan of the attention rank: ("eager", n), ("capture", n) or ("replay", n).
GRAPH_PLAN = (
    ("eager", 5),
    ("capture", 8),
    ("replay", 8),
    ("replay", 8),
    ("capture", 16),  # the FFN rank keeps one graph: this evicts the 8-token one
    ("replay", 16),
    ("replay", 8),  # served eagerly by the FFN rank now
    ("eager", 3),
    ("replay", 16),
)


class KnownFFN:
    """An FFN model computing :func:`ffn_function` (what FFNStepGraphs captures)."""

    def afd_exchange_layers(self) -> tuple[int, ...]:
        return tuple(range(LAYERS))

    def afd_compute_ffn(self, layer: int, hidden: Any, router_logits: Any) -> Any:
        return ffn_function(hidden, layer, router_logits)


def serve_graph_steps(port: int, gate: bool) -> dict[str, Any]:
    """FFN rank: eager steps by hand, graph steps through FFNStepGraphs (one graph kept)."""
    import torch

    from afd_ffn.loops.graph_steps import FFNStepGraphs
    from afd_ffn.stats import FFNStats

    conn = connect("ffn", port, FFN_DEVICE, gate)
    stats = FFNStats()
    graphs = FFNStepGraphs(
        conn,
        KnownFFN(),
        tuple(range(LAYERS)),
        device=torch.device("cuda", FFN_DEVICE),
        max_graphs=1,
        stats=stats,
    )
    kinds = []
    try:
        for _ in GRAPH_PLAN:
            step = conn.ffn.next_step()
            kinds.append((step.is_graph_step, step.is_graph_capturing, step.tokens[0][0]))
            print(f"ffn: serving {kinds[-1]}", flush=True)  # where a hang happens
            if step.is_graph_step:
                graphs.serve(step)
                continue
            for layer in range(LAYERS):
                batch = conn.ffn.recv(step, layer, 0)
                conn.ffn.send(batch, ffn_function(batch.hidden, layer, batch.router_logits))
    finally:
        conn.close()
    return {
        "kinds": kinds,
        "stats": stats.as_dict(),
        "cached": [k[1] for k in graphs.cached_shapes],
    }


def attend_graph_steps(port: int, gate: bool) -> dict[str, Any]:
    """Attention rank: capture whole steps in CUDA graphs as vLLM does, replay, check."""
    import torch

    from afd_core.wire.metadata import AFDDPMetadata, ControlPayload

    conn = connect("attention", port, ATTENTION_DEVICE, gate)
    spec, device = conn.wire, torch.device("cuda", ATTENTION_DEVICE)
    gen = torch.Generator(device=device).manual_seed(11)
    graphs: dict[int, tuple[Any, Any, Any, list[Any]]] = {}
    mismatches, checked = [], 0

    def random_inputs(n: int) -> tuple[Any, Any]:
        hidden = torch.randint(-50, 50, (n, spec.hidden_size), generator=gen, device=device)
        logits = torch.randint(-4, 4, (n, max(spec.router_logits_width, 1)), generator=gen,
                               device=device)  # fmt: skip
        return hidden.to(torch.bfloat16), logits.float()

    def exchange_all(step_id: int, hidden: Any, logits: Any) -> list[Any]:
        outs = []
        for layer in range(LAYERS):
            x = hidden + layer  # some device work between exchanges, as in a model
            lg = logits if spec.logits_width_at(layer) else None
            conn.attention.send(layer, 0, x, router_logits=lg)
            outs.append(conn.attention.recv(layer, 0))
        return outs

    def check(step_id: int, hidden: Any, logits: Any, outs: list[Any]) -> None:
        nonlocal checked
        for layer, out in enumerate(outs):
            lg = logits if spec.logits_width_at(layer) else None
            if not torch.equal(out, ffn_function(hidden + layer, layer, lg)):
                mismatches.append((step_id, layer))
            checked += 1

    try:
        for step_id, (kind, n) in enumerate(GRAPH_PLAN):
            print(f"attention: step {step_id} {kind} {n}", flush=True)  # where a hang happens
            payload = ControlPayload(
                step_id,
                0,
                (AFDDPMetadata(0, (n,)),),
                is_graph_capturing=kind == "capture",
                is_graph_step=kind != "eager",
            )
            if kind == "eager":
                conn.attention.begin_step(payload)
                hidden, logits = random_inputs(n)
                check(step_id, hidden, logits, exchange_all(step_id, hidden, logits))
            elif kind == "capture":
                hidden, logits = random_inputs(n)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with conn.attention.graph_capture(), torch.cuda.graph(graph):  # vLLM: global
                    conn.attention.begin_step(payload)
                    outs = exchange_all(step_id, hidden, logits)
                graphs[n] = (graph, hidden, logits, outs)
            else:
                graph, hidden, logits, outs = graphs[n]
                fresh_hidden, fresh_logits = random_inputs(n)
                hidden.copy_(fresh_hidden)
                logits.copy_(fresh_logits)
                conn.attention.begin_step(payload)
                graph.replay()
                conn.attention.watch_graph_replay(step_id)
                torch.cuda.synchronize()
                check(step_id, hidden, logits, outs)
    finally:
        conn.close()
    return {"mismatches": mismatches, "checked": checked}


# Tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("gate", [False, True], ids=["gate-on-ffn", "gate-on-attention"])
def test_round_trips_over_nccl_return_the_ffn_function_exactly(
    ranks: Ranks, port: int, gate: bool
) -> None:
    ranks.start("ffn", serve, port, gate)
    ranks.start("attention", attend, port, gate)
    results = ranks.join()
    ffn, attention = results["ffn"], results["attention"]
    assert attention["mismatches"] == []
    assert attention["exchanges"] == len(STEP_TOKENS) * LAYERS
    assert attention["devices"] == [f"cuda:{ATTENTION_DEVICE}"]
    assert ffn["tokens"] == list(STEP_TOKENS)
    assert ffn["devices"] == [f"cuda:{FFN_DEVICE}"]
    expected_logits = [gate and layer != 0 for _ in STEP_TOKENS for layer in range(LAYERS)]
    assert ffn["with_logits"] == expected_logits
    print(f"RESULT nccl round trips gate={gate}: {attention['exchanges']} exact")


def test_messages_of_other_layers_are_detected_by_the_per_step_header_check(
    ranks: Ranks, port: int
) -> None:
    ranks.start("ffn", serve_wrong_layers, port)
    ranks.start("attention", attend_one_step, port)
    results = ranks.join()
    ffn_error, ffn_message = results["ffn"]
    assert ffn_error == "AFDProtocolError", ffn_message
    assert "layer: received 0, expected 1" in ffn_message, ffn_message
    attention_error, attention_message = results["attention"]
    assert attention_error == "AFDProtocolError", attention_message
    assert "layer: received 1, expected 0" in attention_message, attention_message
    print(f"RESULT nccl header mismatch: {ffn_message} | {attention_message}")


@pytest.mark.parametrize("gate", [False, True], ids=["gate-on-ffn", "gate-on-attention"])
def test_graph_steps_captured_on_both_sides_replay_the_ffn_function_exactly(
    ranks: Ranks, port: int, gate: bool
) -> None:
    ranks.start("ffn", serve_graph_steps, port, gate)
    ranks.start("attention", attend_graph_steps, port, gate)
    results = ranks.join()
    ffn, attention = results["ffn"], results["attention"]
    assert attention["mismatches"] == []
    computed = sum(1 for kind, _ in GRAPH_PLAN if kind != "capture") * LAYERS
    assert attention["checked"] == computed
    expected_kinds = [(k != "eager", k == "capture", n) for k, n in GRAPH_PLAN]
    assert ffn["kinds"] == expected_kinds
    stats = ffn["stats"]
    assert stats["graphs_captured"] == 2
    assert stats["graph_replays"] == 4  # 8, 8, then 16, 16
    assert stats["graph_steps_eager"] == 1  # the 8-token replay after its graph was evicted
    assert ffn["cached"] == [((16,),)]
    print(f"RESULT nccl graph steps gate={gate}: {attention['checked']} exact, FFN {stats}")
