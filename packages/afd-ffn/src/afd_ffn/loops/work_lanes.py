"""Serving an in-band connector's FFN endpoint: one thread per lane, :class:`WorkLanes`,
each serving its items with :class:`WorkItemServer`.

A connector without a control plane (``FFNWorkEndpoint``) hands the FFN rank work items,
not steps: each lane (one per stage the attention ranks may have in flight) delivers
whatever arrived on it, from any attention rank, in arrival order. Lanes are independent
(an attention rank's two stages never wait on each other), so each gets its own thread
(``afd-ffn-lane-<n>``), which repeats ``next_work`` and the server's ``serve`` until the
endpoint returns None (the connector was closed).

The first lane that fails records its exception and closes the connector, which ends the
other lanes' waits; :meth:`WorkLanes.run` then raises that exception. The lanes compute
one item at a time (vLLM's forward context is a module global, and the model's kernels
already use every core), each inside the compute context. Free of torch and vLLM.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from afd_core.connector import FFNWorkEndpoint, FFNWorkItem
from afd_core.errors import AFDShutdown
from afd_core.workers.profiling import FFN_SEND, afd_range
from afd_ffn.loops.compute import LayerCompute
from afd_ffn.stats import FFNStats


class WorkItemServer:
    """Computes a work item (its rows through this rank's experts, with the item's
    routing) and sends the result back; called by every lane's thread.

    ``on_item`` runs after each item served. Counts into ``stats`` under its own lock.
    """

    def __init__(
        self,
        endpoint: FFNWorkEndpoint,
        compute: LayerCompute,
        *,
        compute_context: Callable[[], AbstractContextManager[Any]],
        stats: FFNStats,
        on_item: Callable[[], None],
    ) -> None:
        self._endpoint = endpoint
        self._compute = compute
        self._compute_context = compute_context
        self._stats = stats
        self._on_item = on_item
        self._lock = threading.Lock()

    def __call__(self, item: FFNWorkItem) -> None:
        """Serve ``item``."""
        received_at = time.perf_counter()
        with self._lock, self._compute_context():
            output = self._compute(item.layer, item.hidden, routing=item.routing)
        with afd_range(FFN_SEND, item.layer):
            self._endpoint.send_work(item, output)
        with self._lock:
            self._stats.layer_exchanges += 1
            self._stats.work_items += 1
            self._stats.busy_s += time.perf_counter() - received_at
        self._on_item()


class WorkLanes:
    """Serves every lane of ``endpoint`` with ``serve`` (compute the item, send the result).

    ``close`` closes the connector (it must make every ``next_work`` return None or raise
    AFDShutdown). One run per connector.
    """

    def __init__(
        self,
        endpoint: FFNWorkEndpoint,
        serve: Callable[[FFNWorkItem], None],
        close: Callable[[], None],
        name: str = "afd-ffn-lane",
    ) -> None:
        self._endpoint = endpoint
        self._serve = serve
        self._close = close
        self._name = name
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def run(self) -> None:
        """Serve until the connector is closed; raise the first lane's error, if any."""
        threads = [
            threading.Thread(
                target=self._lane, args=(lane,), name=f"{self._name}-{lane}", daemon=True
            )
            for lane in range(self._endpoint.num_lanes)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._error is not None:
            raise self._error

    def _lane(self, lane: int) -> None:
        try:
            while (item := self._endpoint.next_work(lane)) is not None:
                self._serve(item)
        except AFDShutdown:
            pass
        except BaseException as exc:  # recorded and raised by run()
            with self._lock:
                first = self._error is None
                if first:
                    self._error = exc
            if first:
                self._close()
