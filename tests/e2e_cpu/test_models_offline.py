"""The role wrappers against the real vLLM model classes, offline, without connectors.

For each tiny model a child process (this file run as a script, in-process vLLM engines)
generates greedily with:

* the stock vLLM class;
* the registered AFD wrapper with AFD off;
* the attention role with an in-process *loopback* exchanger that runs an FFN role model
  built in the same process, once with the gate on FFN and once with it on attention.

It also records the parameters each role builds and loads. The tests compare everything
to the stock run: tokens and logprobs must be identical, and the two roles' parameters
must split the stock parameters exactly.

The child keeps vLLM's general plugins out (``VLLM_PLUGINS=""``): the afd plugin would give
the attention config the AFD attention worker, which connects to a real FFN deployment.
It registers the wrappers itself, from afd-models' own ``afd_models`` hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The two tiny checkpoints, and a DeepSeek-V3 variant of the second one derived here
# (noaux_tc routing: a routing bias the router on the FFN role adds, sigmoid scores,
# expert groups, a routed scaling factor).
MODELS = ("tiny-qwen3-moe", "tiny-deepseek-v2", "tiny-deepseek-v3-noaux")
# The reference connector: parsing the AFD config imports it, nothing connects.
CONNECTOR = "P2pGlooAFDConnector"
NEW_TOKENS = 8
KV_CACHE_BYTES = 64 * 1024 * 1024
CHILD_TIMEOUT_S = 600
GATE_PLACEMENTS = ("gate_on_ffn", "gate_on_attention")
# The child's engines stay alive: an engine that goes tears down vLLM's parallel groups,
# which the engines and models that come after it share.
_ENGINES: list[Any] = []


# --------------------------------------------------------------------------------------
# Child process: runs the engines and writes a JSON report.
# --------------------------------------------------------------------------------------


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


def _engine_kwargs(model: Path, *, compiled: bool) -> dict[str, Any]:
    return {
        "model": str(model),
        "tokenizer": str(model),
        "dtype": "bfloat16",
        "max_model_len": 256,
        "max_num_seqs": 8,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "seed": 0,
        "enforce_eager": not compiled,
    }


def _afd(role: str, gate_on_attention: bool) -> dict[str, Any]:
    return {
        "afd": {
            "role": role,
            "connector": CONNECTOR,
            "compute_gate_on_attention": gate_on_attention,
        }
    }


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


def _config(model: Path, additional_config: dict[str, Any]) -> Any:
    """The VllmConfig an eager engine for ``model`` would get."""
    from vllm.engine.arg_utils import EngineArgs

    kwargs = _engine_kwargs(model, compiled=False)
    return EngineArgs(**kwargs, additional_config=additional_config).create_engine_config()


def _build(model: Path, additional_config: dict[str, Any]) -> tuple[Any, Any, set[str]]:
    """A model built and loaded the way vLLM's default loader does, plus the names its
    ``load_weights`` reports; returns (model, vllm_config, loaded names)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import (
        initialize_model,
        process_weights_after_loading,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = _config(model, additional_config)
    loader = get_model_loader(config.load_config)
    cpu = torch.device("cpu")
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype):
        with cpu:
            built = initialize_model(vllm_config=config)
        loaded = built.load_weights(loader.get_all_weights(config.model_config, built))
        process_weights_after_loading(built, config.model_config, cpu)
    return built.eval(), config, set(loaded)


def run_child(model_dir: Path, work_dir: Path, compiled: bool) -> dict[str, Any]:
    """Every run of one model (see the module docstring); compiled: only the attention
    role with the gate on attention, compiled by vLLM (the FFN role runs eagerly)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.models import ModelRegistry

    from afd_core.specs import load_target
    from afd_models.hooks import afd_models

    # vLLM's parallel groups (world size 1), as an engine's worker creates them: the FFN
    # role models are built outside any engine; the engines reuse these groups.
    with set_current_vllm_config(_config(model_dir, {})):
        init_distributed_environment(1, 0, f"file://{work_dir / 'dist-init'}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
    wrappers = {spec.architecture: load_target(spec.target) for spec in afd_models()}
    # Registering classes, not "module:Class" strings, makes vLLM inspect them in this
    # process instead of a subprocess (about 12 s per class with a cold cache). First the
    # stock class each wrapper subclasses, under its own name.
    for architecture, wrapper in wrappers.items():
        stock = next(c for c in wrapper.__mro__ if c.__module__.startswith("vllm."))
        assert stock.__name__ == architecture, (wrapper, stock)
        ModelRegistry.register_model(architecture, stock)
    report: dict[str, Any] = {}
    if not compiled:
        report["stock"] = _generate(model_dir, {}, compiled)
    # vLLM caches the resolved class per model path: the wrapper runs use another path.
    wrapped = work_dir / "wrapped"
    wrapped.symlink_to(model_dir.resolve(), target_is_directory=True)
    for architecture, wrapper in wrappers.items():
        ModelRegistry.register_model(architecture, wrapper)
    if not compiled:
        report["wrapper_off"] = _generate(wrapped, {}, compiled)
    for placement in ("gate_on_attention",) if compiled else GATE_PLACEMENTS:
        report[placement] = _loopback_run(wrapped, placement == "gate_on_attention", compiled)
    return report


def _loopback_run(model: Path, gate_on_attention: bool, compiled: bool) -> dict[str, Any]:
    """The attention role generating through a loopback exchanger to an FFN role model."""
    from dataclasses import asdict

    from afd_models.exchange_op import set_exchanger

    ffn, ffn_config, ffn_loaded = _build(model, _afd("ffn", gate_on_attention))
    attention, _, attention_loaded = _build(model, _afd("attention", gate_on_attention))
    exchanger = LoopbackExchanger(ffn, ffn_config)
    set_exchanger(exchanger)
    try:
        run = _generate(model, _afd("attention", gate_on_attention), compiled)
    finally:
        set_exchanger(None)
    run.update(
        exchange_calls=exchanger.calls,
        attention_loaded=sorted(attention_loaded),
        attention_wire=asdict(attention.afd_wire_spec()),
        attention_layers=list(attention.afd_exchange_layers()),
        ffn_class=type(ffn).__name__,
        ffn_params={n: list(p.shape) for n, p in ffn.named_parameters()},
        ffn_loaded=sorted(ffn_loaded),
        ffn_wire=asdict(ffn.afd_wire_spec()),
        ffn_layers=list(ffn.afd_exchange_layers()),
    )
    return run


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoints by name: from ``$AFD_TINY_MODELS`` when set (built by
    ``python -m afd_models.tiny``), else built once for this module."""
    tiny = os.environ.get("AFD_TINY_MODELS")
    out = tmp_path_factory.mktemp("tiny-models")
    if not tiny:
        tiny = str(out)
        subprocess.run([sys.executable, "-m", "afd_models.tiny", tiny], check=True, timeout=600)
    dirs = {name: Path(tiny) / name for name in MODELS[:2]}
    dirs[MODELS[2]] = out / MODELS[2]
    _derive_deepseek_v3(dirs["tiny-deepseek-v2"], dirs[MODELS[2]])
    return dirs


def _derive_deepseek_v3(source: Path, target: Path) -> None:
    """A DeepSeek-V3 (noaux_tc) checkpoint from the tiny DeepSeek-V2 one."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
    )
    (target / "config.json").write_text(json.dumps(config, indent=1))
    tensors = load_file(target / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name in [n for n in tensors if n.endswith(".mlp.gate.weight")]:
        bias = torch.rand(config["n_routed_experts"], generator=generator) * 0.5
        tensors[name.replace(".weight", ".e_score_correction_bias")] = bias
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Compile and model-info caches shared by the children of this module.

    The first forward of a process compiles vLLM's helper kernels with inductor (about
    20 s here); the second child finds them in the shared cache.
    """
    root = tmp_path_factory.mktemp("caches")
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(root / "vllm")),
    }


@pytest.fixture(scope="module")
def child(
    model_dirs: dict[str, Path], caches: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., dict[str, Any]]:
    """``child(model, compiled=False)``: that child's report (each child runs once)."""
    reports: dict[tuple[str, bool], dict[str, Any]] = {}

    def run(model: str, compiled: bool = False) -> dict[str, Any]:
        if (model, compiled) not in reports:
            reports[model, compiled] = _spawn_child(
                model_dirs[model], caches, tmp_path_factory, compiled=compiled
            )
        return reports[model, compiled]

    return run


@pytest.fixture(params=MODELS)
def report(request: pytest.FixtureRequest, child: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The eager child's report for each tiny model."""
    return child(request.param)


def _spawn_child(
    model_dir: Path,
    caches: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    *,
    compiled: bool,
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp(model_dir.name)
    out = work / "report.json"
    env = os.environ | caches
    env |= {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_PLUGINS": "",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TMPDIR": str(work),
    }
    if not compiled:
        # Eager runs compile nothing of the model, but vLLM's sampler compiles a logprobs
        # helper on first use (about 15 s here); every run of the child skips it alike.
        env["TORCHDYNAMO_DISABLE"] = "1"
    command = [sys.executable, __file__, str(model_dir), str(work), str(out)]
    if compiled:
        command.append("--compiled")
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"child for {model_dir.name} failed ({done.returncode}):\n{done.stderr[-6000:]}"
        )
    return json.loads(out.read_text())


def _num_layers(params: dict[str, list[int]]) -> int:
    return 1 + max(int(name.split(".")[2]) for name in params if name.startswith("model.layers."))


def _moe_layers(params: dict[str, list[int]]) -> set[int]:
    return {int(name.split(".")[2]) for name in params if name.endswith(".mlp.gate.weight")}


def _num_experts(params: dict[str, list[int]]) -> int:
    return next(shape[0] for name, shape in params.items() if name.endswith(".w13_weight"))


def _forwards(calls: list[list[Any]], num_layers: int) -> list[list[list[Any]]]:
    """The exchange calls cut into forwards, checking each forward ran every layer once,
    in order, on one batch."""
    assert len(calls) % num_layers == 0
    forwards = [calls[i : i + num_layers] for i in range(0, len(calls), num_layers)]
    for forward in forwards:
        assert [layer for layer, _, _ in forward] == list(range(num_layers))
        assert len({tokens for _, tokens, _ in forward}) == 1
    return forwards


def test_wrapper_with_afd_off_is_the_stock_model(report: dict[str, Any]) -> None:
    stock, wrapper = report["stock"], report["wrapper_off"]
    assert wrapper["class"] == "AFD" + stock["class"], "the registered wrapper was not used"
    assert wrapper["params"] == stock["params"]
    assert wrapper["tokens"] == stock["tokens"]
    assert wrapper["logprobs"] == stock["logprobs"]


@pytest.mark.parametrize("placement", GATE_PLACEMENTS)
def test_loopback_attention_role_reproduces_stock_outputs_bit_for_bit(
    report: dict[str, Any], placement: str
) -> None:
    run, stock = report[placement], report["stock"]
    assert run["class"] == "Attention" + stock["class"]
    assert run["ffn_class"] == "FFN" + stock["class"]
    assert run["tokens"] == stock["tokens"]
    assert run["logprobs"] == stock["logprobs"]


@pytest.mark.parametrize("placement", GATE_PLACEMENTS)
def test_roles_split_the_stock_parameters_and_load_all_of_them(
    report: dict[str, Any], placement: str
) -> None:
    run, stock = report[placement], report["stock"]["params"]
    attention, ffn = run["params"], run["ffn_params"]
    assert not set(attention) & set(ffn)
    assert attention | ffn == stock
    assert sorted(attention) == run["attention_loaded"]
    assert sorted(ffn) == run["ffn_loaded"]
    assert all(".mlp." in name for name in ffn)
    assert {name for name in stock if name.endswith(".e_score_correction_bias")} <= set(ffn)
    gates = sorted(name for name in stock if name.endswith(".mlp.gate.weight"))
    mlp_on_attention = sorted(name for name in attention if ".mlp." in name)
    assert mlp_on_attention == (gates if placement == "gate_on_attention" else [])


@pytest.mark.parametrize("placement", GATE_PLACEMENTS)
def test_every_decoder_layer_exchanges_once_per_forward_in_order(
    report: dict[str, Any], placement: str
) -> None:
    run, stock = report[placement], report["stock"]["params"]
    num_layers = _num_layers(stock)
    assert run["attention_layers"] == list(range(num_layers)) == run["ffn_layers"]
    # Eager with an explicit KV-cache size: no warm-up forward, one prefill forward and
    # one forward per further new token.
    assert len(_forwards(run["exchange_calls"], num_layers)) == NEW_TOKENS
    with_logits = {layer for layer, _, has_logits in run["exchange_calls"] if has_logits}
    assert with_logits == (_moe_layers(stock) if placement == "gate_on_attention" else set())


@pytest.mark.parametrize("placement", GATE_PLACEMENTS)
def test_both_roles_agree_on_the_wire_spec(report: dict[str, Any], placement: str) -> None:
    run, stock = report[placement], report["stock"]["params"]
    wire = run["ffn_wire"]
    assert run["attention_wire"] == wire
    assert wire["dtype"] == "bfloat16"
    assert wire["num_exchange_layers"] == _num_layers(stock)
    assert wire["router_logits_width"] == (
        _num_experts(stock) if placement == "gate_on_attention" else 0
    )


def test_exchange_op_runs_on_every_layer_under_vllm_torch_compile(
    child: Callable[..., dict[str, Any]],
) -> None:
    """Without enforce_eager vLLM compiles the decoder stack (DYNAMO_TRACE_ONCE +
    inductor on CPU); the op must stay opaque and run its Python code at run time.

    One model only: a compiled child takes about a minute here (DeepSeek's compiled run
    was checked by hand, see docs/models.md).
    """
    run = child("tiny-qwen3-moe", compiled=True)["gate_on_attention"]
    stock = child("tiny-qwen3-moe")["stock"]
    forwards = _forwards(run["exchange_calls"], _num_layers(stock["params"]))
    # The compile warm-up forward, then the same forwards as in eager mode.
    assert len(forwards) == 1 + NEW_TOKENS
    assert run["tokens"] == stock["tokens"]
    # The exchange is a fusion boundary for inductor, so bf16 rounding differs slightly
    # from the eager run (see docs/models.md): the logprobs of the generated tokens are
    # compared with a tolerance.
    for tokens, run_steps, stock_steps in zip(
        stock["tokens"], run["logprobs"], stock["logprobs"], strict=True
    ):
        for token, run_top, stock_top in zip(tokens, run_steps, stock_steps, strict=True):
            run_logprob = dict(map(tuple, run_top))[token]
            stock_logprob = dict(map(tuple, stock_top))[token]
            assert run_logprob == pytest.approx(stock_logprob, abs=0.05)


if __name__ == "__main__":
    _model_dir, _work_dir, _out = (Path(arg) for arg in sys.argv[1:4])
    _report = run_child(_model_dir, _work_dir, compiled="--compiled" in sys.argv[4:])
    _out.write_text(json.dumps(_report))
