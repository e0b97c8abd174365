"""``HcclOpProvider``: the op provider of the compiled Ascend kernels. **Hardware-unverified.**

It implements :class:`afd_core.op_provider.OpProvider` as
:class:`~afd_ascend_ops.reference.ReferenceOpProvider` does, with HCCL in place of gloo:
:meth:`~HcclOpProvider.open` first makes sure the compiled ``PrivateUse1`` kernels of its
op family are loaded (:func:`afd_ascend_ops.compiled.load_npu_kernels`, which names what
is missing), then opens one ``ProcessGroupHCCL`` of the whole world per stage on the
world's rendezvous store (``site.opener.prefix_store``, the reference provider's stage
prefixes; one store for every rank, so no per-group store bound to a host) and returns
each group's HCCL communicator name: the ``group_ep`` / ``group_name`` the kernels look
the communicator up by.

Waits: the compiled kernels bound every device wait by the AFD timeout passed to them; a
device wait cannot be woken from the host, so :meth:`~HcclOpProvider.interrupt` makes
later opens refuse and :meth:`~HcclOpProvider.close` shuts the groups down, while an op
already waiting on the device ends at its own bound (see docs/ascend.md).

No Ascend device, CANN toolkit or torch-npu could be installed on this project's
machines: this module is type-checked against the committed torch-npu stubs
(``tests/npu``), never run. It imports ``torch_npu`` at module level; only the NPU
path imports it (:func:`afd_connectors_npu.providers`-style factories pick it by
platform).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TYPE_CHECKING

from torch_npu._C._distributed_c10d import ProcessGroupHCCL

from afd_ascend_ops.compiled import load_npu_kernels
from afd_ascend_ops.reference.provider import OpFamily, stage_prefix
from afd_core.errors import AFDShutdown
from afd_core.op_provider import OpProvider

if TYPE_CHECKING:
    from afd_core.op_provider import GroupSite


class HcclOpProvider(OpProvider):
    """One rank's Ascend data plane: an HCCL group per stage, named for the kernels.

    ``family`` picks the ops (``"p2p"``: ``a2e``/``e2a``; ``"async"``: the CAM async ops,
    whose compiled kernels this package does not ship, so opening it raises
    AFDInstallError naming them). Open it once; :meth:`interrupt` and :meth:`close` may
    run on any thread, any number of times.
    """

    def __init__(self, family: OpFamily = "p2p") -> None:
        self._family: OpFamily = family
        self._lock = threading.Lock()
        self._groups: list[ProcessGroupHCCL] = []
        self._closed = False

    def open(self, site: GroupSite, num_stages: int) -> tuple[str, ...]:
        """Load the kernels, open one HCCL group per stage, return their communicator
        names in stage order (collective over the world; bounded by ``site.timeout_s``)."""
        load_npu_kernels(self._family)
        options = ProcessGroupHCCL.Options()
        options._timeout = timedelta(seconds=site.timeout_s)
        names: list[str] = []
        for stage in range(num_stages):
            with self._lock:
                if self._closed:
                    raise AFDShutdown("afd_ascend: the op provider was closed during open()")
            store = site.opener.prefix_store(stage_prefix(stage))
            group = ProcessGroupHCCL(store, site.world_rank, site.world_size, options)
            with self._lock:
                self._groups.append(group)
            names.append(group.get_hccl_comm_name(site.world_rank))
        return tuple(names)

    def interrupt(self) -> None:
        """Refuse later opens (a device wait in progress ends at its own bound)."""
        with self._lock:
            self._closed = True

    def close(self) -> None:
        """Interrupt, then shut every group down (idempotent)."""
        self.interrupt()
        with self._lock:
            groups, self._groups = self._groups, []
        for group in groups:
            group.shutdown()
