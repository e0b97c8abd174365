"""The exchange patterns' pairing rules, and the assembler's check of a recipe's slots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from afd_core.assembly import (
    EXPERT_ROUTED,
    P2P_BLOCK,
    Control,
    Layout,
    OpPlane,
    Recipe,
    RuntimeSpec,
    TransportPlane,
)
from afd_core.config import AFDConfig
from afd_core.connector import WireSpec
from afd_core.errors import AFDConfigError
from afd_core.failures import Fuse
from afd_core.kit.pairing import ALL_TO_ALL
from afd_core.runtime.assembler import check_recipe
from afd_core.topology import Topology
from tests.unit.core.test_topology import BLOCKS


@pytest.mark.parametrize(("a", "f"), sorted(BLOCKS))
def test_p2p_block_announces_to_and_exchanges_with_the_serving_ffn_rank_only(a, f):
    topo = Topology(a, f)
    for ffn in range(f):
        block = tuple(BLOCKS[a, f][ffn])
        assert P2P_BLOCK.announcers_of(topo, ffn) == block
        assert P2P_BLOCK.attention_peers(topo, ffn) == block
        for attention in block:
            assert P2P_BLOCK.ffn_peers(topo, attention) == (ffn,)
            assert P2P_BLOCK.announce_to(topo, attention) == (ffn,)
    senders = [s for ffn in range(f) for s in P2P_BLOCK.announcers_of(topo, ffn)]
    assert sorted(senders) == list(range(a))


def test_p2p_block_liveness_peers_are_the_serving_ffn_rank_or_the_block():
    topo = Topology(5, 3)
    assert P2P_BLOCK.liveness_peers(topo, "attention", 3) == (topo.world_rank("ffn", 1),)
    assert P2P_BLOCK.liveness_peers(topo, "ffn", 1) == (5, 6)
    assert P2P_BLOCK.liveness_peers(topo, "ffn", 2) == (7,)


def test_expert_routed_pairs_every_attention_rank_with_every_ffn_rank_and_relays_steps():
    topo = Topology(2, 3, ALL_TO_ALL)  # fewer attention than FFN ranks is fine here
    assert EXPERT_ROUTED.ffn_peers(topo, 1) == (0, 1, 2)
    assert EXPERT_ROUTED.attention_peers(topo, 2) == (0, 1)
    assert EXPERT_ROUTED.announce_to(topo, 1) == (0,)
    assert EXPERT_ROUTED.announcers_of(topo, 0) == (0, 1)
    assert EXPERT_ROUTED.announcers_of(topo, 1) == ()
    # An FFN rank watches the other FFN ranks (FFN rank 0 relays the steps) and its peers.
    assert EXPERT_ROUTED.liveness_peers(topo, "ffn", 2) == (0, 1, 3, 4)
    assert EXPERT_ROUTED.liveness_peers(topo, "attention", 0) == (0, 1, 2)


def recipe_error(recipe: Recipe) -> str:
    """The AFDConfigError the assembler raises, before any rendezvous, for ``recipe``."""
    config = AFDConfig(role="ffn", connector="Recipe")
    wire = WireSpec(hidden_size=8, dtype="float32", num_exchange_layers=1)
    spec = RuntimeSpec("Recipe", config, 0, wire, Fuse("Recipe"), lambda error: None)
    with pytest.raises(AFDConfigError) as caught:
        check_recipe(spec, recipe)
    return str(caught.value)


def test_the_assembler_refuses_recipes_whose_slots_do_not_fit():
    plane = TransportPlane(lambda site: site.control)
    ops = OpPlane(lambda: None)  # type: ignore[arg-type,return-value]
    p2p = Recipe(Layout.WORLD, Control.ANNOUNCED, plane, P2P_BLOCK)
    assert "runs on a TransportPlane, the recipe gives a OpPlane" in recipe_error(
        replace(p2p, data=ops)
    )
    assert "works with Control.ANNOUNCED" in recipe_error(replace(p2p, control=Control.IN_BAND))
    on_links = replace(p2p, layout=Layout.LINKS, replay_guard=lambda site: None)
    assert "use Layout.WORLD" in recipe_error(on_links)
