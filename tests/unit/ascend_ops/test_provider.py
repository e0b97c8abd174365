"""ReferenceOpProvider's life cycle, with an opener whose transports only record calls
(the ops over real gloo groups: tests/integration/test_ascend_reference_ops.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from afd_ascend_ops import registry  # noqa: E402
from afd_ascend_ops.reference import ReferenceOpProvider  # noqa: E402
from afd_ascend_ops.reference.group import ReferenceGroup  # noqa: E402
from afd_core.dataplane.op_provider import GroupOpener, GroupSite  # noqa: E402
from afd_core.errors import AFDPeerError, AFDShutdown  # noqa: E402
from afd_core.topology import Topology  # noqa: E402
from tests.unit.ascend_ops.recording import RecordingTransport  # noqa: E402


class Opener(GroupOpener):
    """Opens ``good`` transports, then fails like a rank that did not come."""

    def __init__(self, good: int) -> None:
        self.good = good
        self.opened: list[tuple[str, RecordingTransport]] = []

    def prefix_store(self, name):
        raise AssertionError("the reference provider opens gloo transports")

    def open_gloo(self, name):
        if len(self.opened) == self.good:
            raise AFDPeerError(f"rank 1 did not come to {name}")
        transport = RecordingTransport()
        self.opened.append((name, transport))
        return transport


def site(opener: Opener) -> GroupSite:
    return GroupSite(0, 3, Topology(2, 1), 5.0, opener)


def test_open_registers_one_group_per_stage_and_close_releases_them_once():
    opener = Opener(good=2)
    provider = ReferenceOpProvider()
    names = provider.open(site(opener), 2)
    assert [name for name, _ in opener.opened] == ["afd_ascend/stage0", "afd_ascend/stage1"]
    assert len(set(names)) == 2 and names == provider.names
    assert [registry.lookup(name, ReferenceGroup).name for name in names] == list(names)
    provider.close()
    provider.close()
    assert provider.names == ()
    for name in names:
        with pytest.raises(AFDShutdown, match="was closed"):
            registry.lookup(name, ReferenceGroup)
    for _, transport in opener.opened:
        assert transport.calls.count("close") == 1 and transport.calls[0] == "interrupt"


def test_a_failed_open_closes_what_it_opened():
    opener = Opener(good=1)
    with pytest.raises(AFDPeerError, match="did not come to afd_ascend/stage1"):
        ReferenceOpProvider().open(site(opener), 2)
    ((_, transport),) = opener.opened
    assert "close" in transport.calls


def test_interrupt_before_open_refuses_it_and_open_twice_is_an_error():
    provider = ReferenceOpProvider()
    provider.interrupt()
    with pytest.raises(AFDShutdown, match="closed before open"):
        provider.open(site(Opener(good=1)), 1)
    opened = ReferenceOpProvider()
    opened.open(site(Opener(good=2)), 1)
    try:
        with pytest.raises(RuntimeError, match="open already"):
            opened.open(site(Opener(good=2)), 1)
    finally:
        opened.close()


def test_interrupted_groups_refuse_every_later_call():
    provider = ReferenceOpProvider()
    (name,) = provider.open(site(Opener(good=1)), 1)
    provider.interrupt()
    x = torch.ones(2, 8, dtype=torch.bfloat16)
    with pytest.raises(AFDShutdown, match="is closed"):
        torch.ops.afd_ascend.a2e(x, None, None, 2, 8, 2, 1, 2, 0, name)
    provider.close()
