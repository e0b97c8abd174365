"""The role wrappers against the real vLLM model classes, offline, without connectors.

For each tiny model a child process (``models_offline_child.py``: in-process vLLM engines)
generates greedily with the stock class, with the registered wrapper and AFD off, and with
the attention role whose exchanges a *loopback* exchanger serves from an FFN role model
built in the same process (gate on FFN, gate on attention). It also records the
parameters each role builds and loads. The tests compare everything to the stock run:
tokens and logprobs must be identical, and the two roles' parameters must split the stock
parameters exactly. A compiled child runs the attention role compiled by vLLM, to show
that the exchange op survives torch.compile.

vLLM's CPU MLA path depends on the processor: with AMX it takes ``AMX_MLA``, without it
the generic ``CPU_MLA`` backend, whose post-load processing adds parameters derived from
``kv_b_proj`` (``W_UK_T``, ``W_UV``). On an AMX host the DeepSeek cases therefore also run
with ``--attention-backend CPU_MLA``, so a run on either kind of machine covers both paths.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cpu.harness import BF16_RTOL, logprobs_mismatch
from tests.e2e_cpu.models_offline_child import EXPERT_FFN_RANKS, GATE_PLACEMENTS, NEW_TOKENS

# The two tiny checkpoints, and a DeepSeek-V3 variant of the second one derived here
# (noaux_tc routing: a routing bias the router on the FFN role adds, sigmoid scores,
# expert groups, a routed scaling factor).
MODELS = ("tiny-qwen3-moe", "tiny-deepseek-v2", "tiny-deepseek-v3-noaux")
CHILD = Path(__file__).with_name("models_offline_child.py")
CHILD_TIMEOUT_S = 600


def amx_host() -> bool:
    """Whether vLLM's CPU platform takes its AMX paths here (its own condition)."""
    import torch

    return platform.machine() in ("x86_64", "AMD64") and torch.cpu._is_amx_tile_supported()


#: (model, attention backend) of every eager child; None lets vLLM choose.
CASES = [(model, None) for model in MODELS] + (
    [(model, "CPU_MLA") for model in MODELS if "deepseek" in model] if amx_host() else []
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dirs(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The checkpoints by name: the session's tiny models and the derived DeepSeek-V3."""
    dirs = {name: tiny_models / name for name in MODELS[:2]}
    dirs[MODELS[2]] = tmp_path_factory.mktemp("derived-models") / MODELS[2]
    _derive_deepseek_v3(dirs["tiny-deepseek-v2"], dirs[MODELS[2]])
    return dirs


def _derive_deepseek_v3(source: Path, target: Path) -> None:
    """A DeepSeek-V3 (noaux_tc) checkpoint from the tiny DeepSeek-V2 one."""
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
def caches(vllm_cache_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Compile and model-info caches shared by the children of this module.

    The first forward of a process compiles vLLM's helper kernels with inductor; later
    children find them in the shared cache.
    """
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path_factory.mktemp("inductor-cache")),
        "VLLM_CACHE_ROOT": str(vllm_cache_root),
    }


@pytest.fixture(scope="module")
def child(
    model_dirs: dict[str, Path], caches: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., dict[str, Any]]:
    """``child(model, compiled=False, backend=None)``: that child's report (each runs once)."""
    reports: dict[tuple[str, bool, str | None], dict[str, Any]] = {}

    def run(model: str, compiled: bool = False, backend: str | None = None) -> dict[str, Any]:
        key = (model, compiled, backend)
        if key not in reports:
            reports[key] = _spawn_child(
                model_dirs[model], caches, tmp_path_factory, compiled=compiled, backend=backend
            )
        return reports[key]

    return run


@pytest.fixture(params=CASES, ids=lambda case: "-".join(filter(None, case)))
def report(request: pytest.FixtureRequest, child: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The eager child's report for each case (model and attention backend)."""
    model, backend = request.param
    return child(model, backend=backend)


def _spawn_child(
    model_dir: Path,
    caches: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    *,
    compiled: bool,
    backend: str | None,
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
    command = [sys.executable, str(CHILD), str(model_dir), str(work), str(out)]
    if compiled:
        command.append("--compiled")
    if backend is not None:
        command += ["--attention-backend", backend]
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


def role_split_problems(
    stock: dict[str, Any], attention: dict[str, Any], ffn: dict[str, Any]
) -> list[str]:
    """What is wrong with how two roles split a checkpoint and its parameters (empty: none).

    Each argument is a loading record of ``models_offline_child.build_model`` (``checkpoint``:
    tensors fed to the model's loader, ``loaded``: parameters the loader reports,
    ``before``/``after``: parameters before/after vLLM's post-load processing). The rules:

    * every checkpoint tensor reaches exactly one role's loader;
    * every parameter a role holds before post-processing was loaded from the checkpoint,
      and every one its loader reports exists;
    * the parameters vLLM's post-processing adds (or removes) are exactly those it adds
      (or removes) in the stock model, split between the roles: derived parameters (MLA's
      ``W_UK_T``/``W_UV`` on CPUs without AMX) come from what vLLM does, not from a list.
    """
    problems = []
    roles = {"attention": attention, "ffn": ffn}
    fed = {role: record["checkpoint"] for role, record in roles.items()}
    for role, names in fed.items():
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            problems.append(f"the {role} role was fed {twice} more than once")
    both = sorted(set(fed["attention"]) & set(fed["ffn"]))
    if both:
        problems.append(f"both roles load the checkpoint tensors {both}")
    unloaded = sorted(set(stock["checkpoint"]) - set(fed["attention"]) - set(fed["ffn"]))
    if unloaded:
        problems.append(f"no role loads the checkpoint tensors {unloaded}")
    strangers = sorted((set(fed["attention"]) | set(fed["ffn"])) - set(stock["checkpoint"]))
    if strangers:
        problems.append(f"the roles load tensors the checkpoint does not have: {strangers}")
    for role, record in roles.items():
        not_loaded = sorted(set(record["before"]) - set(record["loaded"]))
        if not_loaded:
            problems.append(f"the {role} role holds parameters it did not load: {not_loaded}")
        phantom = sorted(set(record["loaded"]) - set(record["before"]))
        if phantom:
            problems.append(f"the {role} role reports loading parameters it lacks: {phantom}")
    for change in ("added", "removed"):
        expected = _post_processing_change(stock, change)
        attention_side = _post_processing_change(attention, change)
        ffn_side = _post_processing_change(ffn, change)
        if attention_side & ffn_side:
            problems.append(f"post-processing {change} {sorted(attention_side & ffn_side)} twice")
        if attention_side | ffn_side != expected:
            problems.append(
                f"post-processing {change} {sorted(attention_side | ffn_side)} on the roles, "
                f"{sorted(expected)} on the stock model"
            )
    return problems


def _post_processing_change(record: dict[str, Any], change: str) -> set[str]:
    """Parameters vLLM's post-load processing ``"added"`` to or ``"removed"`` from a model."""
    before, after = set(record["before"]), set(record["after"])
    return after - before if change == "added" else before - after


@pytest.mark.parametrize("placement", GATE_PLACEMENTS)
def test_roles_split_the_checkpoint_and_the_stock_parameters(
    report: dict[str, Any], placement: str
) -> None:
    run, stock = report[placement], report["stock"]
    attention, ffn = run["params"], run["ffn_params"]
    assert not set(attention) & set(ffn)
    assert attention | ffn == stock["params"]
    assert role_split_problems(stock["loading"], run["attention_loading"], run["ffn_loading"]) == []
    assert all(".mlp." in name for name in ffn)
    assert {n for n in stock["params"] if n.endswith(".e_score_correction_bias")} <= set(ffn)
    gates = sorted(name for name in stock["params"] if name.endswith(".mlp.gate.weight"))
    mlp_on_attention = sorted(name for name in attention if ".mlp." in name)
    assert mlp_on_attention == (gates if placement == "gate_on_attention" else [])


#: The DeepSeek cases that take vLLM's generic MLA path (explicitly on AMX hosts).
GENERIC_MLA_CASES = [
    (model, "CPU_MLA" if amx_host() else None) for model in MODELS if "deepseek" in model
]


@pytest.mark.parametrize("case", GENERIC_MLA_CASES, ids=lambda case: case[0])
def test_the_generic_mla_path_derives_parameters_after_loading(
    child: Callable[..., dict[str, Any]], case: tuple[str, str | None]
) -> None:
    """The case the split check must handle: vLLM adds W_UK_T/W_UV after loading."""
    model, backend = case
    added = _post_processing_change(child(model, backend=backend)["stock"]["loading"], "added")
    assert added
    assert {name.rsplit(".", 1)[1] for name in added} == {"W_UK_T", "W_UV"}


def test_the_split_check_fails_when_a_tensor_is_loaded_twice_or_not_at_all(
    report: dict[str, Any],
) -> None:
    """The check above on this model's real loading records, broken on purpose."""
    stock = report["stock"]["loading"]
    run = report["gate_on_ffn"]
    attention, ffn = run["attention_loading"], run["ffn_loading"]
    assert role_split_problems(stock, attention, ffn) == []
    stolen = attention["checkpoint"][0]
    shared = dict(ffn, checkpoint=[*ffn["checkpoint"], stolen])
    assert role_split_problems(stock, attention, shared) == [
        f"both roles load the checkpoint tensors {[stolen]}"
    ]
    dropped = dict(ffn, checkpoint=ffn["checkpoint"][1:])
    assert role_split_problems(stock, attention, dropped) == [
        f"no role loads the checkpoint tensors {[ffn['checkpoint'][0]]}"
    ]
    bogus = "model.layers.0.mlp.bogus"
    extra_param = dict(ffn, before=[*ffn["before"], bogus], after=[*ffn["after"], bogus])
    assert role_split_problems(stock, attention, extra_param) == [
        f"the ffn role holds parameters it did not load: {[bogus]}"
    ]


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


# Expert-routed roles (ExpertRoutedAFDConnector's split), served in the child by a loopback
# that routes with afd-core's own helpers -------------------------------------------------

#: Logprob tolerance of expert-routed runs over several FFN ranks: each rank's partial sum
#: is rounded to bf16 before they are added (the monolithic kernel rounds once), which moves
#: a logit by about one bf16 ulp; the suite's bf16 tolerance (BF16_RTOL) covers two.
EXPERT_LOGPROB_ATOL = 1e-3


def _expert(report: dict[str, Any], num_ffn_ranks: int) -> dict[str, Any]:
    return report[f"expert_routed_{num_ffn_ranks}"]


def _expert_name(name: str) -> int | None:
    """The expert id of a routed expert tensor name (``...mlp.experts.<E>.*``), else None."""
    parts = name.split(".")
    if "experts" not in parts or not parts[parts.index("experts") + 1].isdigit():
        return None
    return int(parts[parts.index("experts") + 1])


@pytest.mark.parametrize("num_ffn_ranks", EXPERT_FFN_RANKS)
def test_expert_routed_roles_reproduce_the_stock_outputs(
    report: dict[str, Any], num_ffn_ranks: int
) -> None:
    run, stock = _expert(report, num_ffn_ranks), report["stock"]
    assert run["class"] == "Attention" + stock["class"]
    assert run["tokens"] == stock["tokens"]
    if num_ffn_ranks == 1:  # one partial per token: nothing is rounded twice
        assert run["logprobs"] == stock["logprobs"]
        return
    for prompt, (got, want) in enumerate(zip(run["logprobs"], stock["logprobs"], strict=True)):
        for position, (x, y) in enumerate(zip(want, got, strict=True)):
            problem = logprobs_mismatch(
                dict(map(tuple, x)), dict(map(tuple, y)), EXPERT_LOGPROB_ATOL, BF16_RTOL
            )
            assert not problem, f"prompt {prompt} position {position}: {problem}: {x} vs {y}"


@pytest.mark.parametrize("num_ffn_ranks", EXPERT_FFN_RANKS)
def test_expert_routed_roles_split_the_checkpoint_by_expert_block(
    report: dict[str, Any], num_ffn_ranks: int
) -> None:
    run, stock = _expert(report, num_ffn_ranks), report["stock"]
    checkpoint = set(stock["loading"]["checkpoint"])
    attention_fed = set(run["attention_loading"]["checkpoint"])
    assert all(_expert_name(n) is None for n in attention_fed), "attention loaded experts"
    covered = []
    for (start, stop), loading in zip(run["ffn_blocks"], run["ffn_loadings"], strict=True):
        for name in loading["checkpoint"]:
            local = _expert_name(name)
            assert local is not None and 0 <= local < stop - start, name
            covered.append(name.replace(f".experts.{local}.", f".experts.{start + local}."))
    assert len(covered) == len(set(covered)), "an expert tensor was loaded by two FFN ranks"
    assert attention_fed | set(covered) == checkpoint
    assert not attention_fed & set(covered)
    for role in [run["attention_loading"], *run["ffn_loadings"]]:
        assert set(role["before"]) == set(role["loaded"])


@pytest.mark.parametrize("num_ffn_ranks", EXPERT_FFN_RANKS)
def test_each_ffn_rank_holds_exactly_its_expert_block(
    report: dict[str, Any], num_ffn_ranks: int
) -> None:
    run = _expert(report, num_ffn_ranks)
    moe_layers = set(run["attention_layers"])
    stock_experts = _num_experts(report["stock"]["params"])
    sizes = [stop - start for start, stop in run["ffn_blocks"]]
    assert sum(sizes) == stock_experts and max(sizes) - min(sizes) <= 1
    for (start, stop), params in zip(run["ffn_blocks"], run["ffn_params"], strict=True):
        w13 = {int(n.split(".")[2]): shape for n, shape in params.items() if "w13_weight" in n}
        assert set(w13) == moe_layers
        assert all(shape[0] == stop - start for shape in w13.values())
        assert all(".experts." in n for n in params), "an FFN rank holds more than experts"


@pytest.mark.parametrize("num_ffn_ranks", EXPERT_FFN_RANKS)
def test_expert_routed_roles_exchange_the_moe_layers_only(
    report: dict[str, Any], num_ffn_ranks: int
) -> None:
    run, stock = _expert(report, num_ffn_ranks), report["stock"]["params"]
    moe_layers = sorted(_moe_layers(stock))
    assert run["attention_layers"] == moe_layers
    wire = run["attention_wire"]
    assert all(w == wire for w in run["ffn_wires"])
    assert wire["exchange_layer_ids"] == moe_layers
    assert (wire["num_experts"], wire["top_k"]) == (_num_experts(stock), 2)
    layers = [layer for layer, _ in run["exchange_calls"]]
    assert layers == moe_layers * (len(layers) // len(moe_layers))
