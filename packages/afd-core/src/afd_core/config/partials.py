"""The precision of the partial results expert-routed FFN ranks return: one key, one meaning.

With an expert-routed connector each FFN rank returns partial results (its experts'
share of each token's MoE output) and the attention rank adds them. ``partials_dtype``
(a ``connector_extra_config`` key of ``ExpertRoutedAFDConnector`` and
``CAMAsyncAFDConnector``) says in which dtype they travel:

* ``"model"`` (the default): the model's dtype (bfloat16 for the supported checkpoints),
  as vLLM's expert kernel returns them. Each FFN rank's partial is rounded once before the
  attention rank adds the parts in float32, so the MoE output differs from monolithic
  vLLM's (one rounding of the whole sum) by up to one rounding per part;
* ``"float32"``: the FFN rank computes its experts with float32 accumulation up to the
  output (the reference expert path of :mod:`afd_models.routed`, which rounds where
  vLLM's CPU expert kernel rounds: the intermediate activation), and the partials travel
  in float32; the attention rank rounds the sum once, as monolithic vLLM does, so the
  two differ only by the order of float32 sums. Twice the return bytes, and the FFN
  rank keeps a copy of its expert weights for the reference path.

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from afd_core.errors import AFDConfigError

PartialsDtype = Literal["model", "float32"]
PARTIALS_DTYPES: tuple[PartialsDtype, ...] = ("model", "float32")
#: The ``connector_extra_config`` key.
KEY = "partials_dtype"


def parse_partials_dtype(raw: Mapping[str, Any], connector: str) -> PartialsDtype:
    """The ``partials_dtype`` of ``connector_extra_config`` ``raw`` (default ``"model"``);
    AFDConfigError for another value."""
    value = raw.get(KEY, "model")
    if value not in PARTIALS_DTYPES:
        raise AFDConfigError(
            f"AFD config: connector_extra_config.{KEY} of {connector} is {value!r}; use "
            '"model" (partials in the model dtype, the default) or "float32"'
        )
    return value  # type: ignore[no-any-return]


def partials_dtype(extra: Mapping[str, Any]) -> PartialsDtype:
    """The partials dtype a validated config's ``connector_extra_config`` asks for (what
    the FFN model reads at load time, before any connector exists)."""
    value = extra.get(KEY, "model")
    return "float32" if value == "float32" else "model"


def wire_dtype(partials: PartialsDtype, model_dtype: str) -> str:
    """The wire dtype name of the partials: ``model_dtype`` or ``"float32"``."""
    return "float32" if partials == "float32" else model_dtype
