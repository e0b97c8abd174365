"""The FFN role's loop for a connector that announces steps: :class:`StepLoop`.

It repeats::

    step = endpoint.next_step()                      # None once the connector is closed
    for layer in exchange layers:
        for stage in step's stages:
            batch = endpoint.recv(step, layer, stage)
            endpoint.send(batch, compute(layer, batch))

Layer-major, as :class:`~afd_core.connector.FFNEndpoint` requires: an attention rank with
two stages in flight sends both stages of a layer before it collects either result.
Each step runs inside the compute context; CUDA graph steps (the attention rank captured
or replays a graph of its forward) go to :class:`~afd_ffn.loops.graph_steps.FFNStepGraphs`.
Free of torch and vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from afd_core.connector import FFNEndpoint, FFNStep
from afd_core.errors import AFDProtocolError
from afd_core.workers.profiling import FFN_RECV, FFN_SEND, FFN_STEP, FFN_WAIT_STEP, afd_range
from afd_ffn.loops.compute import LayerCompute
from afd_ffn.loops.graph_steps import FFNStepGraphs
from afd_ffn.stats import FFNStats


class StepLoop:
    """Serves ``endpoint``'s steps over ``layers`` with ``compute``.

    ``graphs`` serves graph steps (None: this rank computes on no CUDA device, and a
    graph step is an AFDProtocolError). ``on_step`` runs after every step served.
    Counts into ``stats``; one thread.
    """

    def __init__(
        self,
        endpoint: FFNEndpoint,
        layers: tuple[int, ...],
        compute: LayerCompute,
        *,
        compute_context: Callable[[], AbstractContextManager[Any]],
        graphs: FFNStepGraphs | None,
        stats: FFNStats,
        on_step: Callable[[], None],
    ) -> None:
        self._endpoint = endpoint
        self._layers = layers
        self._compute = compute
        self._compute_context = compute_context
        self._graphs = graphs
        self._stats = stats
        self._on_step = on_step

    def run(self) -> None:
        """Serve steps until the endpoint gives None (the connector was closed).

        AFDPeerError (attention ranks left or were lost) and AFDShutdown propagate.
        """
        while True:
            with afd_range(FFN_WAIT_STEP):
                step = self._endpoint.next_step()
            if step is None:
                return
            self.serve(step)
            self._on_step()

    def serve(self, step: FFNStep) -> None:
        """Compute every stage of every layer of ``step`` (layer-major) and send the results.

        A capture step (CUDA graphs) moves no data: it only captures, and counts as no step.
        """
        stats = self._stats
        with self._compute_context(), afd_range(FFN_STEP):
            if step.is_graph_step:
                self._serve_graph_step(step)
                if step.is_graph_capturing:
                    return
                stats.layer_exchanges += len(self._layers) * step.num_stages
            else:
                for layer in self._layers:
                    for stage in range(step.num_stages):
                        self._serve_layer(step, layer, stage)
                        stats.layer_exchanges += 1
        for rank, counts in zip(step.attention_ranks, step.tokens, strict=True):
            tokens, key = sum(counts), str(rank)
            stats.tokens += tokens
            by_rank = stats.tokens_by_attention_rank
            if key in by_rank:
                by_rank[key] += tokens
            else:  # a new dict, so that a reader copying the old one never sees it grow
                stats.tokens_by_attention_rank = {**by_rank, key: tokens}
        stats.stages += step.num_stages
        stats.two_stage_steps += step.num_stages == 2
        stats.steps += 1

    def _serve_layer(self, step: FFNStep, layer: int, stage: int) -> None:
        with afd_range(FFN_RECV, layer):
            batch = self._endpoint.recv(step, layer, stage)
        received_at = time.perf_counter()
        output = self._compute(layer, batch.hidden, batch.router_logits, batch.routing)
        with afd_range(FFN_SEND, layer):
            self._endpoint.send(batch, output)
        self._stats.busy_s += time.perf_counter() - received_at

    def _serve_graph_step(self, step: FFNStep) -> None:
        if self._graphs is None:
            raise AFDProtocolError(
                f"AFD FFN: attention rank(s) {step.attention_ranks} run CUDA graphs, but this "
                "FFN rank does not compute on a CUDA device; run the FFN role on CUDA or the "
                "attention role with --enforce-eager"
            )
        self._graphs.serve(step)
