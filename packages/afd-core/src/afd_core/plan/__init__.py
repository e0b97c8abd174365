"""``afd plan``'s cost model and planner: how many attention and FFN ranks, what batch and
how many stages, and what AFD buys over monolithic vLLM with expert parallelism.

Pure Python (no torch, no vLLM): a model's ``config.json``
(:func:`~afd_core.plan.model_shape.load_model_shape`), a hardware profile
(:func:`~afd_core.plan.profile.load_profile`: a roofline preset or a file, optionally with
tables ``afd measure`` took of this model) and an SLO go in; a
:class:`~afd_core.plan.search.Plan` comes out. The equations and the profile schema are
in ``docs/planning.md``.

Modules, one job each: ``model_shape`` (config.json), ``profile`` and ``measured`` (the
profile file; ``strict_json`` their strict object reads), ``tables`` (measured curves),
``costs`` (per-layer costs), ``memory`` (per role), ``step`` (one deployment's decode
step), ``search`` (the planner), ``report`` (printing); ``vllm_timing`` is the child
process ``afd measure`` runs with vLLM.
"""

from __future__ import annotations

from afd_core.plan.model_shape import ModelShape, load_model_shape, model_shape_from_config
from afd_core.plan.profile import HardwareProfile, load_profile, parse_profile, preset_names
from afd_core.plan.search import SLO, Plan, Space, plan
from afd_core.plan.step import (
    AFDDeployment,
    MonolithicDeployment,
    Prediction,
    predict_afd,
    predict_monolithic,
)

__all__ = [
    "SLO",
    "AFDDeployment",
    "HardwareProfile",
    "ModelShape",
    "MonolithicDeployment",
    "Plan",
    "Prediction",
    "Space",
    "load_model_shape",
    "load_profile",
    "model_shape_from_config",
    "parse_profile",
    "plan",
    "predict_afd",
    "predict_monolithic",
    "preset_names",
]
