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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TypeVar

from afd_core.topology import ROLES, Role

T = TypeVar("T")

# The part after "<anything>.layers.<N>.mlp." of a decoder layer's MLP/MoE tensor.
_MLP_TENSOR = re.compile(r"(?:^|\.)layers\.\d+\.mlp\.(?P<rest>.+)$")
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


def role_weights(
    weights: Iterable[tuple[str, T]], role: Role, *, gate_on_attention: bool
) -> Iterator[tuple[str, T]]:
    """The ``(name, tensor)`` pairs of a checkpoint iterator that ``role`` loads (lazily).

    Raises ValueError at once for a role other than ``"attention"`` or ``"ffn"``.
    """
    _check_role(role)
    return (
        (name, tensor)
        for name, tensor in weights
        if weight_owner(name, gate_on_attention=gate_on_attention) == role
    )


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"AFD weight filter: role {role!r} must be one of {list(ROLES)}")
