"""The per-layer exchange ops: ``torch.ops.afd.exchange`` and ``torch.ops.afd.exchange_experts``.

vLLM compiles the decoder stack with ``torch.compile(fullgraph=True)`` and drops all
guards (on CPU too, as DYNAMO_TRACE_ONCE + inductor), so Python inside the model's
forward runs once, at trace time. The exchange with the FFN role must run on every
layer of every step, so it is an opaque custom op (the pattern of ``vllm::moe_forward``):

* its fake (meta) implementation returns ``torch.empty_like(hidden)``, which is all
  Dynamo and inductor see;
* its real implementation calls the process's active :class:`~afd_models.roles.Exchanger`
  (:func:`set_exchanger`), at run time, on every call.

Schemas:

* ``afd::exchange(Tensor hidden, Tensor? router_logits, int layer) -> Tensor``: a whole
  MLP/MoE block on the FFN role (P2P connectors), ``Exchanger.exchange``;
* ``afd::exchange_experts(Tensor hidden, Tensor topk_weights, Tensor topk_ids, int layer)
  -> Tensor``: only the routed experts, with the routing the attention role chose
  (expert-routed connectors), ``Exchanger.exchange_experts``.

``layer`` is a Python int baked into the graph as a constant (one call site per layer).

Importing this module registers the op (once per process; importing again is a no-op).
"""

from __future__ import annotations

import torch
from vllm.utils.torch_utils import direct_register_custom_op

from afd_models.roles import Exchanger

_NAMESPACE = "afd"
_OP_NAME = "exchange"

_active_exchanger: Exchanger | None = None


def set_exchanger(exchanger: Exchanger | None) -> None:
    """Install ``exchanger`` as this process's exchanger (None removes it).

    The attention worker calls this once its connector is initialised and before the
    first model forward; the FFN role never does.
    """
    global _active_exchanger
    _active_exchanger = exchanger


def get_exchanger() -> Exchanger:
    """The active exchanger; RuntimeError when none is installed."""
    if _active_exchanger is None:
        raise RuntimeError(
            "AFD: torch.ops.afd.exchange ran but no exchanger is installed in this "
            "process. The AFD attention worker installs one (set_exchanger) before the "
            "first forward: check that worker_cls is 'auto' (or the AFD attention worker) "
            "and that the afd plugin is loaded (VLLM_PLUGINS must not exclude it)"
        )
    return _active_exchanger


def _exchange(hidden: torch.Tensor, router_logits: torch.Tensor | None, layer: int) -> torch.Tensor:
    out = get_exchanger().exchange(hidden, router_logits, layer)
    _check_output(out, hidden, layer)
    return out


def _check_output(out: torch.Tensor, hidden: torch.Tensor, layer: int) -> None:
    """The exchanger's result must be a new tensor shaped like the op's input."""
    if out.shape != hidden.shape or out.dtype != hidden.dtype:
        raise RuntimeError(
            f"AFD: the exchanger returned {tuple(out.shape)} {out.dtype} for layer {layer}, "
            f"but the op's contract is the shape and dtype of the input "
            f"{tuple(hidden.shape)} {hidden.dtype}"
        )
    if hidden.numel() and out.untyped_storage().data_ptr() == hidden.untyped_storage().data_ptr():
        raise RuntimeError(
            f"AFD: the exchanger returned a view of its input for layer {layer}; a custom "
            "op's output must not alias its inputs: return a new tensor"
        )


def _exchange_fake(
    hidden: torch.Tensor, router_logits: torch.Tensor | None, layer: int
) -> torch.Tensor:
    return torch.empty_like(hidden)


def _exchange_experts(
    hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, layer: int
) -> torch.Tensor:
    out = get_exchanger().exchange_experts(hidden, topk_weights, topk_ids, layer)
    _check_output(out, hidden, layer)
    return out


def _exchange_experts_fake(
    hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, layer: int
) -> torch.Tensor:
    return torch.empty_like(hidden)


def _op_is_registered(name: str) -> bool:
    return hasattr(getattr(torch.ops, _NAMESPACE), name)


# The ops live as long as this library object (module global, never released).
_library = torch.library.Library(_NAMESPACE, "FRAGMENT")

for _name, _impl, _fake in (
    (_OP_NAME, _exchange, _exchange_fake),
    ("exchange_experts", _exchange_experts, _exchange_experts_fake),
):
    if not _op_is_registered(_name):
        direct_register_custom_op(
            op_name=_name, op_func=_impl, fake_impl=_fake, target_lib=_library
        )
