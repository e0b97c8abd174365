"""Engine arguments and device facts of the CUDA end-to-end tests.

On the lent H200 machines the pure-Python vLLM of the gpu-harness only runs with the
engine arguments of its ``settings.py``: when ``$GPU_HARNESS_SETTINGS`` names that file,
its ``HARNESS_CLI_ARGS`` go to every server; on an ordinary CUDA install nothing is added.
"""

from __future__ import annotations

import json
import os
import runpy

#: Share of the GPU's memory that each server may claim (three run at once on one GPU).
GPU_MEMORY_UTILIZATION = "0.2"


def harness_cli_args() -> tuple[str, ...]:
    """``HARNESS_CLI_ARGS`` of ``$GPU_HARNESS_SETTINGS``, or nothing when it is unset."""
    path = os.environ.get("GPU_HARNESS_SETTINGS")
    if not path:
        return ()
    return tuple(runpy.run_path(path)["HARNESS_CLI_ARGS"])


def server_args(graphs: bool = False) -> tuple[str, ...]:
    """The extra command-line arguments of every server of this suite.

    ``graphs``: capture FULL_DECODE_ONLY CUDA graphs (the harness's eager flag dropped,
    ``cudagraph_mode`` merged into its compilation config); the server must then be
    started without ``--enforce-eager``.
    """
    args = list(harness_cli_args())
    if graphs:
        args = with_full_decode_graphs(args)
    return (*args, "--gpu-memory-utilization", GPU_MEMORY_UTILIZATION)


def with_full_decode_graphs(args: list[str]) -> list[str]:
    """``args`` without ``--enforce-eager`` and with ``cudagraph_mode`` FULL_DECODE_ONLY."""
    args = [a for a in args if a != "--enforce-eager"]
    flag = "--compilation-config"
    if flag in args:
        i = args.index(flag) + 1
        config = json.loads(args[i]) | {"cudagraph_mode": "FULL_DECODE_ONLY"}
        args[i] = json.dumps(config)
    else:
        args += [flag, json.dumps({"cudagraph_mode": "FULL_DECODE_ONLY"})]
    return args


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
