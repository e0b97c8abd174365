"""``HcclOpProvider``: the op provider of the compiled Ascend kernels. **Hardware-unverified.**

It implements :class:`afd_core.dataplane.op_provider.OpProvider` as
:class:`~afd_ascend_ops.reference.ReferenceOpProvider` does, with HCCL in place of gloo:
:meth:`~HcclOpProvider.open` first makes sure the compiled ``PrivateUse1`` kernels of its
op family are loaded (:func:`afd_ascend_ops.compiled.load_npu_kernels`, which names what
is missing), then opens one ``ProcessGroupHCCL`` of the whole world per stage on the
world's rendezvous store (``site.opener.prefix_store``, the reference provider's stage
prefixes; one store for every rank, so no per-group store bound to a host) and returns
each group's HCCL communicator name: the ``group_ep`` / ``group_name`` the kernels look
the communicator up by. The ``p2p`` family's groups are then registered with the compiled
extension (``afd_ascend_ops._C.open_group``: an NPU the kernels are not built for refused,
the mailbox of this rank zeroed, the world's shape, the timeout and the number of stages
recorded), followed by a barrier of every rank on the rendezvous store, so no rank writes
into a peer's mailbox before the peer has zeroed it. The barrier is not an HCCL one: no HCCL
collective may run on the group after the reset (it could stage data through the window
that holds the mailbox, ``csrc/common/afd_mailbox.h``).

Before any group opens, every rank publishes its ``HCCL_BUFFSIZE`` on the store and the
provider refuses to go on unless all agree: the kernels lay the mailbox out from it, so
ranks that disagree would write past each other's windows (the kernel itself checks only
its own rank's window, ``kStatusWindowSize``).

Waits: the compiled kernels bound every device wait by the AFD timeout and poll a stop
word the host sets: :meth:`~HcclOpProvider.interrupt` sets it for every group
(``_C.interrupt``: a blocked ``a2e``/``e2a`` ends with ``[AFDShutdown]``, later calls
refuse), :meth:`~HcclOpProvider.close` also forgets the groups (``_C.close_group``) and
shuts the HCCL groups down. See ``csrc/README.md`` for the kernels' side.

No Ascend device, CANN toolkit or torch-npu could be installed on this project's
machines: this module is type-checked against the committed torch-npu stubs
(``tests/npu``), never run. It imports ``torch_npu`` at module level; only the NPU
path imports it (:func:`afd_connectors_npu.providers`-style factories pick it by
platform).
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from torch_npu._C._distributed_c10d import ProcessGroupHCCL

from afd_ascend_ops import _C
from afd_ascend_ops.compiled import load_npu_kernels
from afd_ascend_ops.reference.provider import OpFamily, stage_prefix
from afd_core.dataplane.op_provider import OpProvider
from afd_core.errors import AFDConfigError, AFDPeerError, AFDShutdown

if TYPE_CHECKING:
    from torch.distributed import Store

    from afd_core.dataplane.op_provider import GroupSite

#: HCCL's window size in MiB when ``HCCL_BUFFSIZE`` is unset, as the tiling assumes
#: (``csrc/common/op_host/afd_tiling_host.h``).
DEFAULT_HCCL_BUFFSIZE = "200"
#: Store prefixes of the window-size agreement and of each stage's post-reset barrier.
WINDOW_PREFIX = "afd_ascend/window"
RESET_KEY = "mailbox_reset"


def hccl_buffsize() -> str:
    """This process's ``HCCL_BUFFSIZE`` as HCCL reads it (MiB; HCCL's default when unset)."""
    return os.environ.get("HCCL_BUFFSIZE", "").strip() or DEFAULT_HCCL_BUFFSIZE


def gather_on_store(
    store: Store, rank: int, world_size: int, key: str, value: str, timeout_s: float
) -> list[str]:
    """Every rank's ``value`` of ``key``, in world-rank order: sets this rank's, then waits
    for all of them (a barrier when the values do not matter). AFDPeerError naming the
    ranks that did not come within ``timeout_s``."""
    store.set(f"{key}/{rank}", value)
    keys = [f"{key}/{peer}" for peer in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        missing = [peer for peer, name in enumerate(keys) if not store.check([name])]
        raise AFDPeerError(
            f"afd_ascend: world ranks {missing} did not reach '{key}' within {timeout_s} s; "
            "start every rank of the deployment, or raise afd_process_group_timeout_s"
        ) from exc
    return [bytes(store.get(name)).decode() for name in keys]


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
        #: The HCCL groups opened (shut down by close) and the names registered with the
        #: compiled extension (a group whose registration failed has none).
        self._groups: list[ProcessGroupHCCL] = []
        self._names: list[str] = []
        self._closed = False

    def open(self, site: GroupSite, num_stages: int) -> tuple[str, ...]:
        """Load the kernels, open one HCCL group per stage, return their communicator
        names in stage order (collective over the world; bounded by ``site.timeout_s``).
        On any failure whatever it opened is closed again."""
        load_npu_kernels(self._family)
        try:
            self._check_window_sizes(site)
            for stage in range(num_stages):
                self._open_stage(site, stage, num_stages)
        except BaseException:
            self.close()
            raise
        return tuple(self._names)

    @staticmethod
    def _check_window_sizes(site: GroupSite) -> None:
        """AFDConfigError unless every rank has the same ``HCCL_BUFFSIZE``."""
        store = site.opener.prefix_store(WINDOW_PREFIX)
        sizes = gather_on_store(
            store, site.world_rank, site.world_size, "hccl_buffsize", hccl_buffsize(),
            site.timeout_s,
        )  # fmt: skip
        if len(set(sizes)) > 1:
            by_rank = ", ".join(f"world rank {rank}: {size}" for rank, size in enumerate(sizes))
            raise AFDConfigError(
                f"afd_ascend: HCCL_BUFFSIZE differs between the ranks ({by_rank} MiB); the "
                "a2e/e2a mailboxes are laid out in the HCCL window it sizes, so set "
                "HCCL_BUFFSIZE to one value in the environment of every rank"
            )

    def _open_stage(self, site: GroupSite, stage: int, num_stages: int) -> None:
        """Open stage ``stage``'s group, register it with the extension (which zeroes this
        rank's mailbox), then wait on the store until every rank has done so."""
        with self._lock:
            if self._closed:
                raise AFDShutdown("afd_ascend: the op provider was closed during open()")
        options = ProcessGroupHCCL.Options()
        options._timeout = timedelta(seconds=site.timeout_s)
        store = site.opener.prefix_store(stage_prefix(stage))
        group = ProcessGroupHCCL(store, site.world_rank, site.world_size, options)
        with self._lock:
            self._groups.append(group)
        name = group.get_hccl_comm_name(site.world_rank)
        anchor = torch.empty(1, device=torch.device("npu", torch.npu.current_device()))
        topology = site.topology
        _C.open_group(
            name,
            anchor,
            topology.num_ffn_ranks,
            topology.num_attention_ranks,
            site.world_rank,
            site.timeout_s,
            num_stages,
        )
        with self._lock:
            self._names.append(name)
        gather_on_store(store, site.world_rank, site.world_size, RESET_KEY, "1", site.timeout_s)

    def interrupt(self) -> None:
        """Set every group's stop word (blocked ops end with ``[AFDShutdown]``, later ones
        refuse) and refuse later opens. Idempotent, any thread."""
        with self._lock:
            self._closed = True
            names = list(self._names)
        for name in names:
            _C.interrupt(name)

    def close(self) -> None:
        """Interrupt, forget the groups in the extension, shut them down (idempotent)."""
        self.interrupt()
        with self._lock:
            groups, self._groups = self._groups, []
            names, self._names = self._names, []
        for name in names:
            _C.close_group(name)
        for group in groups:
            group.shutdown()
