"""Define the ``afd_ascend`` ops with ``torch.library``: importing this module registers them.

For each schema of :mod:`afd_ascend_ops.schemas` this module

* defines the op in the ``afd_ascend`` namespace with **fragment** semantics, and only
  when ``torch.ops.afd_ascend`` lacks it: a compiled Ascend extension that defines the
  same ops and registers only their ``PrivateUse1`` (NPU) kernels may load before or
  after this module. An op that exists with another schema raises AFDInstallError;
* registers the fake kernel (:mod:`afd_ascend_ops.fake`, also the ``Meta`` kernel) and
  the ``CPU`` kernel (:mod:`afd_ascend_ops.reference.kernels`), each called with the
  dispatcher's arguments bound to the op's argument record (:func:`bound`; the dispatcher
  drops trailing arguments equal to their defaults, and the record's defaults restore
  them).

Upstream's ``afd_plugin._C_ascend`` must not load in the same process: it claims the
whole namespace (``TORCH_LIBRARY``) and registers ``Meta`` kernels of its own, so one of
the two registrations fails, whichever loads second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from afd_ascend_ops import fake
from afd_ascend_ops.reference import kernels
from afd_ascend_ops.schemas import NAMESPACE, OP_ARGS, SCHEMAS, OpArgs
from afd_core.errors import AFDInstallError


def define_missing(library: torch.library.Library, schema: str) -> bool:
    """Define ``schema`` in ``library``'s namespace unless an op of that name exists there.

    Returns whether it defined the op. Raises AFDInstallError when the op exists with a
    different schema (another package defines it differently).
    """
    namespace = library.ns
    name = schema.split("(", 1)[0]
    existing = getattr(getattr(torch.ops, namespace), name, None)
    if existing is None:
        library.define(schema)
        return True
    ours = str(torch._C.parse_schema(f"{namespace}::{schema}"))
    theirs = str(existing.default._schema)
    if theirs != ours:
        raise AFDInstallError(
            f"afd_ascend_ops: the op {namespace}::{name} is already defined as {theirs!r}, "
            f"not {ours!r}; another package (such as upstream afd_plugin._C_ascend) "
            "registered it: do not load it in the same process as afd-ascend-ops"
        )
    return False


def bound(args: type[OpArgs], kernel: Callable[[Any], Any]) -> Callable[..., Any]:
    """A kernel with the op's signature that calls ``kernel`` with one ``args`` record."""

    def call(*values: Any, **named: Any) -> Any:
        return kernel(args(*values, **named))

    call.__name__ = call.__qualname__ = f"{args.OP}_{kernel.__module__.rsplit('.', 1)[-1]}"
    return call


def _register(library: torch.library.Library) -> None:
    for name, schema in SCHEMAS.items():
        define_missing(library, schema)
        qualified = f"{library.ns}::{name}"
        args = OP_ARGS[name]
        torch.library.register_fake(qualified, bound(args, fake.FAKES[name]), lib=library)
        library.impl(name, bound(args, kernels.KERNELS[name]), "CPU")


#: The registrations live as long as this object: the module keeps it.
LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_register(LIBRARY)
