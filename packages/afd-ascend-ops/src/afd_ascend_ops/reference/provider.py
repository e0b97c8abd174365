"""``ReferenceOpProvider``: the op provider of the CPU reference kernels.

It implements :class:`afd_core.dataplane.op_provider.OpProvider`. :meth:`~ReferenceOpProvider.open`
opens one gloo transport of the whole world per stage (``site.opener.open_gloo``, on
the prefix ``afd_ascend/stage<s>``, the same on every rank), wraps each in a group of the
provider's op family with the world's rank map and the AFD timeout
(:class:`~afd_ascend_ops.reference.group.ReferenceGroup` for ``a2e``/``e2a``,
:class:`~afd_ascend_ops.reference.async_group.AsyncGroup` for the CAM async ops),
registers it under a name unique in this process and returns the names, stage by stage:
the ``group_ep`` / ``group_name`` of each stage's op calls.

The NPU provider (:mod:`afd_ascend_ops.npu_provider`) has the same shape: it opens one HCCL
process group per stage on ``site.opener.prefix_store(name)`` and returns their HCCL
communicator names;
the compiled kernels find the groups by those names, and the package's compiled
extension registers only their ``PrivateUse1`` kernels, so the ops, their schemas and
their fake kernels stay the ones of :mod:`afd_ascend_ops.ops`.
"""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING, Literal

from afd_ascend_ops import registry
from afd_core.dataplane.op_provider import OpProvider
from afd_core.errors import AFDShutdown

if TYPE_CHECKING:
    from afd_ascend_ops.reference.async_group import AsyncGroup
    from afd_ascend_ops.reference.group import ReferenceGroup
    from afd_core.dataplane.op_provider import GroupSite

#: The op families: ``"p2p"`` (``a2e``/``e2a``) and ``"async"`` (CAM async).
OpFamily = Literal["p2p", "async"]


def stage_prefix(stage: int) -> str:
    """The store prefix of stage ``stage``'s group (the same on every rank)."""
    return f"afd_ascend/stage{stage}"


class ReferenceOpProvider(OpProvider):
    """One rank's CPU reference data plane: a registered gloo group per stage.

    ``family`` picks the ops its groups serve. Open it once. Thread-safe:
    :meth:`interrupt` and :meth:`close` may run on any thread, any number of times.
    """

    def __init__(self, family: OpFamily = "p2p") -> None:
        if family not in ("p2p", "async"):
            raise ValueError(
                f"ReferenceOpProvider: family must be 'p2p' or 'async', not {family!r}"
            )
        self._family = family
        self._lock = threading.Lock()
        self._groups: list[ReferenceGroup | AsyncGroup] = []
        self._opened = False
        self._interrupted = False

    @property
    def names(self) -> tuple[str, ...]:
        """The names :meth:`open` returned (empty before it and after :meth:`close`)."""
        return tuple(group.name for group in self._groups)

    def open(self, site: GroupSite, num_stages: int) -> tuple[str, ...]:
        """Open and register one group per stage; return their names, stage order.

        Collective over the world's ranks. Raises AFDPeerError when a rank does not come
        within ``site.timeout_s`` (the groups opened so far are closed again),
        AFDShutdown when the provider was interrupted or closed before or meanwhile,
        RuntimeError when it was opened before.
        """
        # Importing the ops registers them: the names are useless without them.
        import afd_ascend_ops.ops  # noqa: F401
        from afd_ascend_ops.header import OpsHeader
        from afd_ascend_ops.reference import async_group
        from afd_ascend_ops.reference import group as p2p_group
        from afd_core.kit.channel import MessageChannel

        if self._family == "p2p":
            kind, mispaired = p2p_group.ReferenceGroup, p2p_group.MISPAIRED
        else:
            kind, mispaired = async_group.AsyncGroup, async_group.MISPAIRED

        if num_stages < 1:
            raise ValueError(f"ReferenceOpProvider.open: num_stages must be >= 1, not {num_stages}")
        if site.world_size != site.topology.world_size:
            raise ValueError(
                f"ReferenceOpProvider.open: the site's world has {site.world_size} ranks, its "
                f"topology {site.topology.world_size}"
            )
        with self._lock:
            if self._interrupted:
                raise AFDShutdown("afd_ascend: the op provider was closed before open()")
            if self._opened:
                raise RuntimeError("ReferenceOpProvider.open: the provider is open already")
            self._opened = True
        token = uuid.uuid4().hex[:12]
        opened: list[ReferenceGroup | AsyncGroup] = []
        try:
            for stage in range(num_stages):
                transport = site.opener.open_gloo(stage_prefix(stage))
                name = f"afd_ascend-ref-{self._family}-{token}-stage{stage}"
                channel = MessageChannel(
                    "afd_ascend",
                    OpsHeader,
                    name,
                    transport,
                    site.world_rank,
                    site.topology,
                    site.timeout_s,
                    mispaired,
                )
                opened.append(kind(channel))
                registry.register(name, opened[-1])
            with self._lock:
                if self._interrupted:
                    raise AFDShutdown("afd_ascend: the op provider was closed during open()")
                self._groups = opened
        except BaseException:
            for group in opened:
                registry.unregister(group.name)
                group.close()
            raise
        return tuple(group.name for group in opened)

    def interrupt(self) -> None:
        """Wake every op blocked on this provider's groups (AFDShutdown); later op calls
        on them raise AFDShutdown too. Idempotent."""
        with self._lock:
            self._interrupted = True
            groups = list(self._groups)
        for group in groups:
            group.interrupt()

    def close(self) -> None:
        """Interrupt, unregister the names and close the groups (idempotent)."""
        self.interrupt()
        with self._lock:
            groups, self._groups = self._groups, []
        for group in groups:
            registry.unregister(group.name)
            group.close()
