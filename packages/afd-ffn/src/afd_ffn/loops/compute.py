"""One FFN computation of a received batch: :class:`LayerCompute`.

Both eager loops of the FFN role (the step loop, :mod:`afd_ffn.loops.step_loop`, and the work
lanes, :mod:`afd_ffn.loops.work_lanes`) compute through it, so the move to the compute device,
the batch's context, the compute range and the row count are written once. CUDA graph
steps compute inside their captured graphs instead (:mod:`afd_ffn.loops.graph_steps`).

Free of torch and vLLM: the tensors are the connector's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from afd_core.connector import ExpertRouting
from afd_core.workers.profiling import FFN_COMPUTE, afd_range
from afd_ffn.stats import FFNStats
from afd_models.roles import FFNModel


class LayerCompute:
    """Computes one layer's batch on ``model``.

    ``device`` (a ``torch.device``, or None to leave tensors where the connector put
    them) is where the model computes: the inputs move there first. ``batch_context(rows)``
    is the context of each batch (see :class:`~afd_ffn.server.FFNServer`). Each call adds
    the batch's rows to ``stats.rows``; the caller holds whatever lock guards ``stats``.
    """

    def __init__(
        self,
        model: FFNModel,
        stats: FFNStats,
        *,
        device: Any | None,
        batch_context: Callable[[int], AbstractContextManager[Any]],
    ) -> None:
        self._model = model
        self._stats = stats
        self._device = device
        self._batch_context = batch_context

    def __call__(
        self,
        layer: int,
        hidden: Any,
        router_logits: Any | None = None,
        routing: ExpertRouting | None = None,
    ) -> Any:
        """``layer``'s FFN of ``hidden`` on the compute device: the experts of ``routing``
        when it is given (expert-routed connectors), else the whole MoE/MLP block (with
        ``router_logits`` when the gate ran on the attention role)."""
        device = self._device
        if device is not None:
            hidden = hidden.to(device)
            router_logits = None if router_logits is None else router_logits.to(device)
            if routing is not None:
                routing = ExpertRouting(
                    routing.topk_ids.to(device), routing.topk_weights.to(device)
                )
        rows = hidden.shape[0]
        with afd_range(FFN_COMPUTE, layer), self._batch_context(rows):
            if routing is None:
                output = self._model.afd_compute_ffn(layer, hidden, router_logits)
            else:
                output = self._model.afd_compute_experts(layer, hidden, routing)
        self._stats.rows += rows
        return output
