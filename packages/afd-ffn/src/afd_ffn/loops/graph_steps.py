"""CUDA graph steps on the FFN rank: one captured graph per step shape, replayed.

When an attention rank captures a CUDA graph of its forward, its capture step
(``is_graph_capturing``) moves no data; the FFN rank captures, at that moment, a graph
of its whole side of such a step: for every layer and stage (layer-major, the order of
:class:`~afd_core.connector.FFNEndpoint`), receive into the stage's fixed input tensors,
compute the FFN, send the result. Later graph steps of the same shape (attention
ranks and token counts) replay it, so the FFN rank too runs no Python per layer. A graph
step whose shape has no graph (never captured, or evicted) runs the same sequence
eagerly. Graphs live in a bounded LRU cache and share one memory pool (steps run one at
a time).

Every host wait is bounded by the connector: the receives and sends of an eager graph
step, and the replay (``FFNEndpoint.wait_for_stream``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from afd_core.connector import Connector, FFNStep
from afd_ffn.stats import FFNStats
from afd_models.roles import FFNModel

logger = logging.getLogger(f"vllm.{__name__}")

#: A step's shape: the attention ranks taking part and their token counts per stage.
ShapeKey = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]


def shape_key(step: FFNStep) -> ShapeKey:
    """The key under which ``step``'s graph is cached."""
    return step.attention_ranks, step.tokens


@dataclass
class _Inputs:
    """Fixed input tensors of one stage (what a captured graph receives into)."""

    hidden: Any
    router_logits: Any | None


@dataclass
class _CapturedStep:
    graph: Any
    inputs: list[_Inputs]


class FFNStepGraphs:
    """Serves the graph steps of one FFN rank (see the module docstring).

    ``max_graphs`` bounds the cache (0: never capture, every graph step runs eagerly).
    Call :meth:`serve` from the server thread, inside its compute context, with
    ``device`` current.
    """

    def __init__(
        self,
        connector: Connector,
        model: FFNModel,
        layers: tuple[int, ...],
        *,
        device: Any,
        max_graphs: int,
        stats: FFNStats,
    ) -> None:
        import torch

        self._torch = torch
        self._connector = connector
        self._model = model
        self._layers = layers
        self._device = device
        self._max_graphs = max_graphs
        self._stats = stats
        self._wire = connector.wire
        self._cache: OrderedDict[ShapeKey, _CapturedStep] = OrderedDict()
        self._pool: Any = None

    @property
    def cached_shapes(self) -> tuple[ShapeKey, ...]:
        """Shapes with a captured graph, least recently used first."""
        return tuple(self._cache)

    def serve(self, step: FFNStep) -> None:
        """Capture, replay or run eagerly the graph step ``step``."""
        key = shape_key(step)
        if step.is_graph_capturing:
            if self._max_graphs > 0 and key not in self._cache:
                self._capture(step, key)
            return
        captured = self._cache.get(key)
        if captured is None:
            self._run(step, self._new_inputs(step))
            self._stats.graph_steps_eager += 1
            return
        self._cache.move_to_end(key)
        captured.graph.replay()
        endpoint = self._connector.ffn
        endpoint.wait_for_stream(f"the CUDA graph of step {step.payloads[0].step_id}")
        self._stats.graph_replays += 1

    def _new_inputs(self, step: FFNStep) -> list[_Inputs]:
        torch, wire = self._torch, self._wire
        dtype, logits_dtype = getattr(torch, wire.dtype), getattr(torch, wire.router_logits_dtype)
        inputs = []
        for stage in range(step.num_stages):
            rows = sum(step.stage_tokens(stage))
            hidden = torch.zeros(rows, wire.hidden_size, dtype=dtype, device=self._device)
            logits = None
            if wire.router_logits_width:
                logits = torch.zeros(
                    rows, wire.router_logits_width, dtype=logits_dtype, device=self._device
                )
            inputs.append(_Inputs(hidden, logits))
        return inputs

    def _run(self, step: FFNStep, inputs: list[_Inputs]) -> None:
        """Every layer and stage of ``step``, layer-major: receive, compute, send (captured
        or not)."""
        endpoint = self._connector.ffn
        for layer in self._layers:
            for stage, tensors in enumerate(inputs):
                logits = self._logits_at(tensors, layer)
                endpoint.recv_into(step, layer, stage, tensors.hidden, logits)
                output = self._model.afd_compute_ffn(layer, tensors.hidden, logits)
                endpoint.send_from(step, layer, stage, output)

    def _logits_at(self, tensors: _Inputs, layer: int) -> Any | None:
        """The stage's router-logit input when ``layer`` carries router logits, else None."""
        return tensors.router_logits if self._wire.logits_width_at(layer) else None

    def _capture(self, step: FFNStep, key: ShapeKey) -> None:
        torch = self._torch
        inputs = self._new_inputs(step)
        # Warm up the kernels of this shape (compilation, workspaces) outside the capture.
        for tensors in inputs:
            for layer in self._layers:
                self._model.afd_compute_ffn(layer, tensors.hidden, self._logits_at(tensors, layer))
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._run(step, inputs)
        self._cache[key] = _CapturedStep(graph, inputs)
        self._stats.graphs_captured += 1
        while len(self._cache) > self._max_graphs:
            evicted, _ = self._cache.popitem(last=False)
            logger.info("AFD FFN: dropped the CUDA graph of step shape %s (cache full)", evicted)
