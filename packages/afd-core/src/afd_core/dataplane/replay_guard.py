"""``ReplayGuard``: what a connector needs to bound device work the host does not wait for.

With CUDA graphs the attention runner queues a replay and goes on, and the FFN rank
replays its own graph; their transfers wait on the device. A connector whose capabilities
have ``cuda_graphs`` gets a ReplayGuard from its transport's package (afd-connectors-gpu
implements it with CUDA events and a watch thread) and calls it at these points:

* attention side: :meth:`ReplayGuard.watch` right after a replay was queued,
  :meth:`ReplayGuard.drain` before an eager step (captured and uncaptured transfers of
  one communicator are never in flight together), :meth:`ReplayGuard.capturing` around
  graph captures;
* FFN side: :meth:`ReplayGuard.wait_for_stream` after replaying its own graph.

Each bound is ``afd_process_group_timeout_s``; past it the guard fails the connector and
ends its transfers, so blocked device work finishes and the next call raises.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol


class ReplayGuard(Protocol):
    """Bounds CUDA graph replays of one connector (see the module docstring)."""

    def watch(self, step_id: int) -> None:
        """Bound the replay of ``step_id`` just queued on the current stream; returns at once."""
        ...

    def drain(self, before: str) -> None:
        """Wait (bounded) until every watched replay finished; ``before`` names what waits.

        Raises AFDPeerError when one overran (the connector is failed then).
        """
        ...

    def capturing(self) -> AbstractContextManager[None]:
        """A context around graph captures: drains first, then makes no CUDA call meanwhile."""
        ...

    def wait_for_stream(self, what: str) -> None:
        """Wait (bounded) until the current stream's queued work is done."""
        ...
