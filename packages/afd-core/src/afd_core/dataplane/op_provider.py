"""The op-provider contract: a data plane whose communication happens inside custom ops.

Some data planes are not a :class:`~afd_core.dataplane.transport.Transport` the endpoints post
tensors on: the Ascend connectors move their data inside torch ops (``a2e``/``e2a``,
CAM dispatch/combine) that find their communication group by a *name* passed as a
string argument. An :class:`OpProvider` is that data plane's owner on one rank:

1. :meth:`OpProvider.open` makes one group per stage over the ranks of the world the
   assembler opened, from the :class:`GroupSite` it is given (the world's rendezvous
   namespace, this rank's number and the world's size), registers each group where its
   ops will find it, and returns the names, stage by stage. Bounded by
   ``site.timeout_s``.
2. The pattern's endpoints call the provider's ops with ``names[stage]``.
3. :meth:`OpProvider.interrupt` makes every op blocked in a wait of this process raise
   promptly (AFDShutdown) and every later op call refuse; :meth:`OpProvider.close`
   interrupts, unregisters the names and releases the groups. Both are idempotent and
   safe from any thread; the assembler calls them in the connector's shutdown order.

Every op call of a provider is bounded by ``site.timeout_s`` and checks what it receives
against what it expects (a mispaired call raises AFDProtocolError naming both sides).
Importing this module imports no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import Store

    from afd_core.dataplane.transport import Transport
    from afd_core.topology import Topology


class GroupOpener(ABC):
    """Where a provider opens its groups: a namespace of the world's rendezvous store.

    Given by the runtime; a provider uses either the store (for a library that makes
    its own group on it, such as HCCL) or a gloo transport of every rank of the world.
    """

    @property
    def address(self) -> str:
        """Where the rendezvous store is (``host:port``), for error messages."""
        return "the AFD rendezvous store"

    @abstractmethod
    def prefix_store(self, name: str) -> Store:
        """A store under this world's ``name/`` prefix (the same on every rank)."""

    @abstractmethod
    def open_gloo(self, name: str) -> Transport:
        """A gloo transport of every rank of this world on the ``name/`` prefix.

        Collective: every rank of the world calls it with the same ``name``. Raises
        AFDPeerError when a rank does not come within the timeout.
        """


@dataclass(frozen=True)
class GroupSite:
    """What :meth:`OpProvider.open` is given.

    ``world_rank`` and ``world_size``: this rank and the size of the world the groups
    span (FFN ranks first, see :mod:`afd_core.topology`); ``topology``: the deployment's
    rank map; ``timeout_s``: the AFD timeout that bounds every wait; ``opener``: where
    to open the groups.
    """

    world_rank: int
    world_size: int
    topology: Topology
    timeout_s: float
    opener: GroupOpener


class OpProvider(ABC):
    """One rank's op-provided data plane (see the module docstring)."""

    @abstractmethod
    def open(self, site: GroupSite, num_stages: int) -> tuple[str, ...]:
        """Open and register one group per stage; return their names, stage order.

        Collective over the world's ranks. Raises AFDPeerError when a rank does not
        come within ``site.timeout_s``; whatever it opened is closed again then.
        """

    @abstractmethod
    def interrupt(self) -> None:
        """Wake every op of this process blocked in a wait; later calls refuse."""

    @abstractmethod
    def close(self) -> None:
        """Interrupt, unregister the names and release the groups (idempotent)."""
