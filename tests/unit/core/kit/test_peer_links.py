"""The contract's link types: the runtime's links are the FFNLinks the sides carry, and a
side without an endpoint context says so instead of handing a pattern None."""

from __future__ import annotations

import inspect

import pytest

from afd_core.assembly import AttentionSide, FFNSide
from afd_core.kit.peer_links import FFNLinks
from afd_core.runtime.links import BlockLinks

#: The members FFNLinks declares (its methods and attributes), not object's or Protocol's.
MEMBERS = sorted(
    name for name in {*vars(FFNLinks), *FFNLinks.__annotations__} if not name.startswith("_")
)


def test_ffn_links_declares_what_the_ffn_endpoints_use():
    assert MEMBERS == [
        "current",
        "ffn_rank",
        "get",
        "idle_error",
        "idle_wait_s",
        "last_loss",
        "lose",
        "lose_transfer",
        "on_change",
        "replacements",
        "settle",
    ]


@pytest.mark.parametrize("name", [m for m in MEMBERS if callable(getattr(FFNLinks, m, None))])
def test_block_links_has_each_method_of_ffn_links_with_its_parameters(name: str):
    declared = inspect.signature(getattr(FFNLinks, name))
    implemented = inspect.signature(getattr(BlockLinks, name))
    assert list(implemented.parameters) == list(declared.parameters), name


def test_block_links_has_the_attributes_of_ffn_links():
    links = BlockLinks(2, [])
    assert links.ffn_rank == 2 and links.replacements == 0 and links.last_loss is None


@pytest.mark.parametrize("side_type", [AttentionSide, FFNSide])
def test_a_side_without_an_endpoint_context_refuses_to_hand_one_out(side_type):
    fields = {"spec": None, "announcer": None} if side_type is AttentionSide else {
        "spec": None, "steps": None, "links": BlockLinks(0, [])
    }  # fmt: skip
    side = side_type(**fields)
    with pytest.raises(ValueError, match="no endpoint context"):
        side.transport_context()
