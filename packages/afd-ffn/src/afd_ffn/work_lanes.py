"""Serving an in-band connector's FFN endpoint: one thread per lane, :class:`WorkLanes`.

A connector without a control plane (``FFNWorkEndpoint``) hands the FFN rank work items,
not steps: each lane (one per stage the attention ranks may have in flight) delivers
whatever arrived on it, from any attention rank, in arrival order. Lanes are independent
(an attention rank's two stages never wait on each other), so each gets its own thread
(``afd-ffn-lane-<n>``), which repeats ``next_work`` and the server's ``serve`` until the
endpoint returns None (the connector was closed).

The first lane that fails records its exception and closes the connector, which ends the
other lanes' waits; :meth:`WorkLanes.run` then raises that exception. Free of torch and
vLLM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from afd_core.connector import FFNWorkEndpoint, FFNWorkItem
from afd_core.errors import AFDShutdown


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
