"""A :class:`~afd_core.dataplane.op_provider.GroupOpener` for tests: a TCPStore of the ranks of one
test, PrefixStores on it, and gloo transports opened on those."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from afd_core.dataplane.op_provider import GroupOpener
from afd_core.errors import AFDPeerError
from afd_core.runtime.gloo import GlooTransport


class StoreGroupOpener(GroupOpener):
    """Groups of ``world_size`` ranks on a TCPStore at ``127.0.0.1:port`` (world rank 0
    hosts it); every rendezvous is bounded by ``timeout_s``."""

    def __init__(self, port: int, world_rank: int, world_size: int, timeout_s: float) -> None:
        self._store = dist.TCPStore(
            "127.0.0.1",
            port,
            world_size,
            is_master=world_rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self._rank = world_rank
        self._size = world_size
        self._timeout_s = timeout_s

    def prefix_store(self, name: str) -> dist.Store:
        return dist.PrefixStore(f"{name}/", self._store)

    def open_gloo(self, name: str) -> GlooTransport:
        try:
            return GlooTransport.open(self.prefix_store(name), self._rank, self._size,
                                      self._timeout_s)  # fmt: skip
        except RuntimeError as exc:
            raise AFDPeerError(f"test opener: the gloo group {name!r} did not form: {exc}") from exc
