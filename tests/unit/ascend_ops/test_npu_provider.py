"""HcclOpProvider's opening protocol, with torch-npu, the compiled extension and the NPU
faked (no Ascend here): every rank's HCCL_BUFFSIZE compared on the store before any group
opens, each stage's group registered with its stage count, then a barrier on the rendezvous
store and never an HCCL collective on the group (it could stage data through the window
that holds the mailboxes)."""

from __future__ import annotations

import importlib
import sys
import threading
import types
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
from torch.distributed import HashStore, PrefixStore  # noqa: E402

from afd_core.dataplane.op_provider import GroupOpener, GroupSite  # noqa: E402
from afd_core.errors import AFDConfigError, AFDPeerError  # noqa: E402
from afd_core.topology import Topology  # noqa: E402


class FakeProcessGroupHCCL:
    """Names itself after its store prefix; an HCCL collective on it fails the test."""

    class Options:
        _timeout = timedelta(seconds=1)

    def __init__(self, store, rank, size, options) -> None:
        self.rank = rank

    def get_hccl_comm_name(self, rank: int) -> str:
        return f"hccl-comm-{id(self)}"

    def barrier(self):
        raise AssertionError("no HCCL collective may run on the group after the mailbox reset")

    def shutdown(self) -> None:
        pass


class Opener(GroupOpener):
    def __init__(self, store: HashStore) -> None:
        self.store = store

    def prefix_store(self, name: str):
        return PrefixStore(name, self.store)

    def open_gloo(self, name: str):
        raise AssertionError("the HCCL provider opens no gloo transport")


@pytest.fixture
def provider_module(monkeypatch):
    """npu_provider imported over fake torch_npu and afd_ascend_ops._C modules; ``opened``
    records each _C.open_group call's (rank, stages)."""
    c10d = types.ModuleType("torch_npu._C._distributed_c10d")
    c10d.ProcessGroupHCCL = FakeProcessGroupHCCL
    opened: list[tuple[int, int]] = []
    extension = types.ModuleType("afd_ascend_ops._C")
    extension.open_group = lambda name, anchor, f, a, rank, timeout, stages: opened.append(
        (rank, stages)
    )
    extension.interrupt = lambda name: None
    extension.close_group = lambda name: None
    for name, module in (
        ("torch_npu", types.ModuleType("torch_npu")),
        ("torch_npu._C", types.ModuleType("torch_npu._C")),
        ("torch_npu._C._distributed_c10d", c10d),
        ("afd_ascend_ops._C", extension),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "afd_ascend_ops.npu_provider", raising=False)
    module = importlib.import_module("afd_ascend_ops.npu_provider")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # dropped again afterwards
    monkeypatch.setattr(module, "load_npu_kernels", lambda family: None)
    fake_torch = types.SimpleNamespace(
        empty=lambda *shape, device: None,
        device=lambda kind, index: (kind, index),
        npu=types.SimpleNamespace(current_device=lambda: 0),
    )
    monkeypatch.setattr(module, "torch", fake_torch)
    module.opened = opened
    return module


def site(store: HashStore, rank: int, timeout_s: float = 5.0) -> GroupSite:
    return GroupSite(rank, 2, Topology(1, 1), timeout_s, Opener(store))


def test_every_rank_opens_each_stage_then_meets_on_the_store_not_on_hccl(
    provider_module, monkeypatch
) -> None:
    monkeypatch.setenv("HCCL_BUFFSIZE", "400")
    store = HashStore()
    names: dict[int, tuple[str, ...]] = {}

    def open_rank(rank: int) -> None:
        names[rank] = provider_module.HcclOpProvider().open(site(store, rank), 2)

    threads = [threading.Thread(target=open_rank, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(provider_module.opened) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert len(names[0]) == len(names[1]) == 2
    for stage in (0, 1):
        prefixed = PrefixStore(f"afd_ascend/stage{stage}", store)
        assert prefixed.check(["mailbox_reset/0", "mailbox_reset/1"])


def test_ranks_with_different_hccl_buffsize_are_refused_before_any_group_opens(
    provider_module, monkeypatch
) -> None:
    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)  # HCCL's default, 200 MiB
    store = HashStore()
    PrefixStore("afd_ascend/window", store).set("hccl_buffsize/1", "400")
    with pytest.raises(AFDConfigError, match=r"world rank 0: 200, world rank 1: 400 MiB"):
        provider_module.HcclOpProvider().open(site(store, 0), 1)
    assert provider_module.opened == []


def test_a_rank_that_never_comes_is_named_after_the_timeout(provider_module) -> None:
    with pytest.raises(AFDPeerError, match=r"world ranks \[1\] did not reach 'hccl_buffsize'"):
        provider_module.HcclOpProvider().open(site(HashStore(), 0, timeout_s=0.2), 1)
