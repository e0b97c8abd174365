"""Which checkpoint tensors each AFD role loads.

Pure string logic on checkpoint names (before vLLM renames them): no torch, no vLLM.
Each role wrapper applies :func:`keep_weight` to the checkpoint iterator before the stock
vLLM loader sees it, so every tensor lands on exactly one role.

Rules, for a name ``...layers.N.mlp.<rest>`` (the MLP or MoE block of decoder layer N):

* ``mlp.gate.e_score_correction_bias`` (DeepSeek-V3 routing bias) -> FFN, always: the
  router's top-k selection, which adds the bias, runs inside the MoE runner on the FFN
  role even when the gate matmul runs on the attention role.
* any other ``mlp.gate.*`` (the router gate) -> attention when the gate runs on attention,
  FFN otherwise.
* every other ``mlp.*`` (routed experts, shared experts, shared-expert gate, the dense
  MLP of dense layers) -> FFN.

Every other name (embeddings, attention, norms, final norm, ``lm_head``, ...) -> attention.

With an expert-routed connector (a :class:`~afd_core.placement.ExpertPlacement`
given) the split is different: ``mlp.experts.<E>.*`` (routed expert ``E``) -> the FFN
rank holding ``E``, which loads it renamed to its local id ``E - first`` of its block;
every other name, the gate, routing bias, shared experts and dense MLPs included ->
attention (see :mod:`afd_models.routed` for why they run there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TypeVar

from afd_core.placement import ExpertPlacement
from afd_core.topology import ROLES, Role

T = TypeVar("T")

# The part after "<anything>.layers.<N>.mlp." of a decoder layer's MLP/MoE tensor.
_MLP_TENSOR = re.compile(r"(?:^|\.)layers\.\d+\.mlp\.(?P<rest>.+)$")
# A routed expert's tensor: "<...>.layers.<N>.mlp.experts.<E>.<rest>".
_EXPERT_TENSOR = re.compile(
    r"^(?P<head>(?:.*\.)?layers\.\d+\.mlp\.experts\.)(?P<expert>\d+)(?P<tail>\..+)$"
)
_ROUTING_BIAS = "e_score_correction_bias"


def weight_owner(name: str, *, gate_on_attention: bool) -> Role:
    """Return the role that loads the checkpoint tensor ``name`` (see the module rules)."""
    match = _MLP_TENSOR.search(name)
    if match is None:
        return "attention"
    module, _, leaf = match["rest"].partition(".")
    if module != "gate":
        return "ffn"
    if leaf == _ROUTING_BIAS:
        return "ffn"
    return "attention" if gate_on_attention else "ffn"


def keep_weight(name: str, role: Role, *, gate_on_attention: bool) -> bool:
    """True when the ``role`` deployment loads the checkpoint tensor ``name``.

    Raises ValueError for a role other than ``"attention"`` or ``"ffn"``.
    """
    _check_role(role)
    return weight_owner(name, gate_on_attention=gate_on_attention) == role


def expert_owner(name: str, placement: ExpertPlacement) -> tuple[Role, int | None]:
    """Expert-routed split: ``("ffn", f)`` for a routed expert of FFN rank ``f``, else
    ``("attention", None)`` (see the module rules)."""
    match = _EXPERT_TENSOR.match(name)
    if match is None:
        return "attention", None
    return "ffn", placement.owner(int(match["expert"]))


def local_expert_name(name: str, block: range) -> str:
    """``name`` of a routed expert of ``block`` with its local id (``E - block.start``)."""
    match = _EXPERT_TENSOR.match(name)
    if match is None or int(match["expert"]) not in block:
        raise ValueError(f"AFD weight filter: {name!r} is not a routed expert of {block}")
    return f"{match['head']}{int(match['expert']) - block.start}{match['tail']}"


def role_weights(
    weights: Iterable[tuple[str, T]],
    role: Role,
    *,
    gate_on_attention: bool,
    placement: ExpertPlacement | None = None,
    ffn_rank: int = 0,
) -> Iterator[tuple[str, T]]:
    """The ``(name, tensor)`` pairs of a checkpoint iterator that ``role`` loads (lazily).

    With ``placement`` (expert-routed) the FFN role of ``ffn_rank`` gets its block of
    routed experts, renamed to local ids. Raises ValueError at once for a role other than
    ``"attention"`` or ``"ffn"``.
    """
    _check_role(role)
    if placement is None:
        return (
            (name, tensor)
            for name, tensor in weights
            if weight_owner(name, gate_on_attention=gate_on_attention) == role
        )
    return _expert_role_weights(weights, role, placement, ffn_rank)


def _expert_role_weights(
    weights: Iterable[tuple[str, T]], role: Role, placement: ExpertPlacement, ffn_rank: int
) -> Iterator[tuple[str, T]]:
    block = placement.block(ffn_rank)
    for name, tensor in weights:
        owner, rank = expert_owner(name, placement)
        if owner != role:
            continue
        if owner == "attention":
            yield name, tensor
        elif rank == ffn_rank:
            yield local_expert_name(name, block), tensor


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"AFD weight filter: role {role!r} must be one of {list(ROLES)}")
