"""The modules of afd that run only on Ascend NPU (the workers, the HCCL op provider): the
only ones that may import ``torch_npu`` or ``vllm_ascend``. The plugin reaches them by
``"module:Class"`` strings or by platform, never by import on CPU or CUDA."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NPU_MODULES = (
    Path("packages/afd-attention/src/afd_attention/worker_npu.py"),
    Path("packages/afd-ffn/src/afd_ffn/worker_npu.py"),
    Path("packages/afd-ascend-ops/src/afd_ascend_ops/npu_provider.py"),
)
