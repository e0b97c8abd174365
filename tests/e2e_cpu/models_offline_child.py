"""The child process of ``test_models_offline.py``: in-process vLLM engines, one report.

``python models_offline_child.py MODEL_DIR WORK_DIR REPORT_JSON [--compiled]
[--attention-backend NAME] [--language-model-only]`` generates greedily with the stock
class, with the registered wrapper and AFD off, and with the attention role whose
exchanges a loopback exchanger serves from an FFN role model built in the same process
(gate on FFN, gate on attention), then writes a JSON report: tokens, logprobs, parameters,
exchange calls, wire specs, and for the stock model and each role the loading record of
:func:`build_model` (checkpoint tensors the model was fed, parameter names its loader reports,
and its parameters before and after vLLM's post-load processing). ``--compiled``: only the
attention role with the gate on attention, compiled by vLLM. ``--attention-backend``:
vLLM's attention backend for every engine and model of the run (e.g. ``CPU_MLA``, the MLA
path of CPUs without AMX, which registers parameters derived from ``kv_b_proj`` after
loading). ``--language-model-only``: vLLM's flag of that name for every engine and model
(a multimodal checkpoint served without its vision tower).

Run it with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engines in this process) and
``VLLM_PLUGINS=""``: the afd plugin would give the attention config the AFD attention
worker, which connects to a real FFN deployment. The wrappers are registered here, from
afd-models' own ``afd_models`` hook.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# The reference connector: parsing the AFD config imports it, nothing connects.
CONNECTOR = "P2pGlooAFDConnector"
# The expert-routed connector, and the FFN rank counts its loopback runs split experts over.
EXPERT_CONNECTOR = "ExpertRoutedAFDConnector"
EXPERT_FFN_RANKS = (1, 2)
NEW_TOKENS = 8
KV_CACHE_BYTES = 64 * 1024 * 1024
GATE_PLACEMENTS = ("gate_on_ffn", "gate_on_attention")
# The engines stay alive: an engine that goes tears down vLLM's parallel groups, which
# the engines and models that come after it share.
_ENGINES: list[Any] = []


class LoopbackExchanger:
    """Runs the FFN role model in the attention role's process, one layer per call."""

    def __init__(self, ffn_model: Any, ffn_config: Any) -> None:
        self.ffn_model = ffn_model
        self.ffn_config = ffn_config
        self.calls: list[tuple[int, int, bool]] = []

    def exchange(self, hidden: Any, router_logits: Any, layer: int) -> Any:
        from vllm.forward_context import set_forward_context

        self.calls.append((layer, hidden.shape[0], router_logits is not None))
        with set_forward_context(None, self.ffn_config):
            return self.ffn_model.afd_compute_ffn(layer, hidden, router_logits)


#: ``--attention-backend`` of this run (None: vLLM chooses by the CPU's instruction set).
_ATTENTION_BACKEND: str | None = None
#: ``--language-model-only`` of this run.
_LANGUAGE_MODEL_ONLY = False


class LoopbackExpertExchanger:
    """Serves an expert-routed attention role from FFN role models of every FFN rank.

    Routes each token to the FFN ranks holding its experts, runs each rank's experts on its
    rows and adds the partial results up, with afd-core's own routing helpers (what the
    connector's endpoints do, without the wire). Records the rows each rank got per layer.
    """

    def __init__(self, ffn_models: list[Any], ffn_config: Any, placement: Any) -> None:
        import torch

        self.ffn_models = ffn_models
        self.ffn_config = ffn_config
        self.placement = placement
        self.owners = torch.tensor(placement.owners(), dtype=torch.int64)
        self.rows: dict[int, dict[int, int]] = {f: {} for f in range(len(ffn_models))}
        self.calls: list[tuple[int, int]] = []

    def exchange_experts(self, hidden: Any, topk_weights: Any, topk_ids: Any, layer: int) -> Any:
        from vllm.forward_context import set_forward_context

        from afd_core.connector import ExpertRouting
        from afd_core.runtime.expert.routing import combine, localize, rows_per_rank

        self.calls.append((layer, hidden.shape[0]))
        parts = []
        routed = rows_per_rank(topk_ids, self.owners, len(self.ffn_models))
        for f, (model, rows) in enumerate(zip(self.ffn_models, routed, strict=True)):
            per_layer = self.rows[f]
            per_layer[layer] = per_layer.get(layer, 0) + int(rows.numel())
            if not rows.numel():
                continue
            ids, weights = localize(topk_ids[rows], topk_weights[rows], self.placement.block(f))
            with set_forward_context(None, self.ffn_config):
                out = model.afd_compute_experts(layer, hidden[rows], ExpertRouting(ids, weights))
            parts.append((rows, out))
        return combine(hidden.shape[0], parts, hidden.shape[1], hidden.dtype, hidden.device)


def _engine_kwargs(model: Path, *, compiled: bool) -> dict[str, Any]:
    backend = {} if _ATTENTION_BACKEND is None else {"attention_backend": _ATTENTION_BACKEND}
    if _LANGUAGE_MODEL_ONLY:
        backend["language_model_only"] = True
    return backend | {
        "model": str(model),
        "tokenizer": str(model),
        "dtype": "bfloat16",
        "max_model_len": 256,
        "max_num_seqs": 8,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "seed": 0,
        "enforce_eager": not compiled,
    }


def afd_settings(role: str, gate_on_attention: bool) -> dict[str, Any]:
    return {
        "afd": {
            "role": role,
            "connector": CONNECTOR,
            "compute_gate_on_attention": gate_on_attention,
        }
    }


def _afd_expert(role: str, num_ffn_ranks: int, ffn_rank: int = 0) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "role": role,
        "connector": EXPERT_CONNECTOR,
        "compute_gate_on_attention": True,
        "num_ffn_ranks": num_ffn_ranks,
        "num_attention_ranks": 1,
    }
    if role == "ffn":
        settings["role_rank"] = ffn_rank
    return {"afd": settings}


def _generate(model: Path, additional_config: dict[str, Any], compiled: bool) -> dict[str, Any]:
    """Greedy tokens and top-2 logprobs of an in-process engine, and its model's params."""
    from vllm import LLM, SamplingParams

    from afd_models.tiny.specs import PROMPTS

    llm = LLM(**_engine_kwargs(model, compiled=compiled), additional_config=additional_config)
    _ENGINES.append(llm)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=2, ignore_eos=True)
    outputs = llm.generate(list(PROMPTS), params, use_tqdm=False)

    def describe(worker: Any) -> dict[str, Any]:
        model = worker.model_runner.model
        return {
            "class": type(model).__name__,
            "params": {n: list(p.shape) for n, p in model.named_parameters()},
        }

    run = llm.collective_rpc(describe)[0]
    run["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
    run["logprobs"] = [
        [sorted((tok, lp.logprob) for tok, lp in step.items()) for step in o.outputs[0].logprobs]
        for o in outputs
    ]
    return run


def engine_config(model: Path, additional_config: dict[str, Any]) -> Any:
    """The VllmConfig an eager engine for ``model`` would get."""
    from vllm.engine.arg_utils import EngineArgs

    kwargs = _engine_kwargs(model, compiled=False)
    return EngineArgs(**kwargs, additional_config=additional_config).create_engine_config()


def build_model(model: Path, additional_config: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """A model built and loaded the way vLLM's default loader does; returns (model,
    vllm_config, loading record).

    The record holds ``checkpoint``: the checkpoint tensor names the model's stock loader
    was fed (for a role: what its weight filter kept; recorded from the filter's output),
    ``loaded``: the parameter names its ``load_weights`` reports, and ``before`` /
    ``after``: its parameter names before and after ``process_weights_after_loading``
    (where vLLM adds parameters derived from loaded ones, e.g. MLA's ``W_UK_T``).
    """
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import (
        initialize_model,
        process_weights_after_loading,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    import afd_models.role_mixins as role_mixins

    config = engine_config(model, additional_config)
    loader = get_model_loader(config.load_config)
    cpu = torch.device("cpu")
    fed: list[str] = []
    role_weights = role_mixins.role_weights

    def recording_role_weights(weights: Any, role: str, **split: Any) -> Any:
        for name, tensor in role_weights(weights, role, **split):
            fed.append(name)
            yield name, tensor

    def checkpoint(weights: Any) -> Any:
        for name, tensor in weights:
            if "afd" not in additional_config:  # the stock model is fed everything
                fed.append(name)
            yield name, tensor

    role_mixins.role_weights = recording_role_weights
    try:
        with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype):
            with cpu:
                built = initialize_model(vllm_config=config)
            weights = checkpoint(loader.get_all_weights(config.model_config, built))
            loaded = built.load_weights(weights)
            before = sorted(n for n, _ in built.named_parameters())
            process_weights_after_loading(built, config.model_config, cpu)
    finally:
        role_mixins.role_weights = role_weights
    record = {
        "checkpoint": fed,
        "loaded": sorted(loaded),
        "before": before,
        "after": sorted(n for n, _ in built.named_parameters()),
    }
    return built.eval(), config, record


def run_child(model_dir: Path, work_dir: Path, compiled: bool) -> dict[str, Any]:
    """Every run of one model (see the module docstring); compiled: only the attention
    role with the gate on attention, compiled by vLLM (the FFN role runs eagerly)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.models import ModelRegistry

    from afd_core.plugins.specs import load_target
    from afd_models.hooks import afd_models

    # vLLM's parallel groups (world size 1), as an engine's worker creates them: the FFN
    # role models are built outside any engine; the engines reuse these groups.
    with set_current_vllm_config(engine_config(model_dir, {})):
        init_distributed_environment(1, 0, f"file://{work_dir / 'dist-init'}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
    wrappers = {spec.architecture: load_target(spec.target) for spec in afd_models()}
    # Registering classes, not "module:Class" strings, makes vLLM inspect them in this
    # process instead of a subprocess (about 12 s per class with a cold cache). First the
    # stock class each wrapper subclasses, under its own name (vLLM serves some under
    # another's: DeepseekV32ForCausalLM is DeepseekV3ForCausalLM on CPU).
    for architecture, wrapper in wrappers.items():
        stock = next(c for c in wrapper.__mro__ if c.__module__.startswith("vllm."))
        ModelRegistry.register_model(architecture, stock)
    report: dict[str, Any] = {}
    if not compiled:
        report["stock"] = _generate(model_dir, {}, compiled)
        report["stock"]["loading"] = build_model(model_dir, {})[2]
    # vLLM caches the resolved class per model path: the wrapper runs use another path.
    wrapped = work_dir / "wrapped"
    wrapped.symlink_to(model_dir.resolve(), target_is_directory=True)
    for architecture, wrapper in wrappers.items():
        ModelRegistry.register_model(architecture, wrapper)
    if not compiled:
        report["wrapper_off"] = _generate(wrapped, {}, compiled)
    for placement in ("gate_on_attention",) if compiled else GATE_PLACEMENTS:
        report[placement] = _loopback_run(wrapped, placement == "gate_on_attention", compiled)
    if not compiled:
        for num_ffn_ranks in EXPERT_FFN_RANKS:
            report[f"expert_routed_{num_ffn_ranks}"] = _expert_run(wrapped, num_ffn_ranks)
    return report


def _expert_run(model: Path, num_ffn_ranks: int) -> dict[str, Any]:
    """The expert-routed attention role served by ``num_ffn_ranks`` FFN role models."""
    from dataclasses import asdict

    from afd_models.exchange_op import set_exchanger

    builds = [
        build_model(model, _afd_expert("ffn", num_ffn_ranks, f)) for f in range(num_ffn_ranks)
    ]
    attention, _, attention_loading = build_model(model, _afd_expert("attention", num_ffn_ranks))
    placement = attention.afd_placement
    exchanger = LoopbackExpertExchanger([b[0] for b in builds], builds[0][1], placement)
    set_exchanger(exchanger)
    try:
        run = _generate(model, _afd_expert("attention", num_ffn_ranks), False)
    finally:
        set_exchanger(None)
    run.update(
        exchange_calls=exchanger.calls,
        attention_loading=attention_loading,
        attention_layers=list(attention.afd_exchange_layers()),
        attention_wire=asdict(attention.afd_wire_spec()),
        ffn_blocks=[
            [placement.block(f).start, placement.block(f).stop] for f in range(num_ffn_ranks)
        ],
        ffn_params=[{n: list(p.shape) for n, p in b[0].named_parameters()} for b in builds],
        ffn_loadings=[b[2] for b in builds],
        ffn_wires=[asdict(b[0].afd_wire_spec()) for b in builds],
        routed_rows=exchanger.rows,
    )
    return run


def _loopback_run(model: Path, gate_on_attention: bool, compiled: bool) -> dict[str, Any]:
    """The attention role generating through a loopback exchanger to an FFN role model."""
    from dataclasses import asdict

    from afd_models.exchange_op import set_exchanger

    ffn, ffn_config, ffn_loading = build_model(model, afd_settings("ffn", gate_on_attention))
    attention, _, attention_loading = build_model(
        model, afd_settings("attention", gate_on_attention)
    )
    exchanger = LoopbackExchanger(ffn, ffn_config)
    set_exchanger(exchanger)
    try:
        run = _generate(model, afd_settings("attention", gate_on_attention), compiled)
    finally:
        set_exchanger(None)
    run.update(
        exchange_calls=exchanger.calls,
        attention_loading=attention_loading,
        attention_wire=asdict(attention.afd_wire_spec()),
        attention_layers=list(attention.afd_exchange_layers()),
        ffn_class=type(ffn).__name__,
        ffn_params={n: list(p.shape) for n, p in ffn.named_parameters()},
        ffn_loading=ffn_loading,
        ffn_wire=asdict(ffn.afd_wire_spec()),
        ffn_layers=list(ffn.afd_exchange_layers()),
    )
    return run


def main(argv: list[str]) -> None:
    """Parse the command line (see the module docstring) and write the report."""
    import argparse

    global _ATTENTION_BACKEND, _LANGUAGE_MODEL_ONLY
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("report", type=Path)
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--language-model-only", action="store_true")
    args = parser.parse_args(argv)
    _ATTENTION_BACKEND = args.attention_backend
    _LANGUAGE_MODEL_ONLY = args.language_model_only
    args.report.write_text(json.dumps(run_child(args.model_dir, args.work_dir, args.compiled)))


if __name__ == "__main__":
    main(sys.argv[1:])
