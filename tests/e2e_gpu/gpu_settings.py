"""Engine arguments and device facts of the CUDA end-to-end tests.

On the lent H200 machines the pure-Python vLLM of the gpu-harness only runs with the
engine arguments of its ``settings.py``: when ``$GPU_HARNESS_SETTINGS`` names that file,
its ``HARNESS_CLI_ARGS`` go to every server; on an ordinary CUDA install nothing is added.
"""

from __future__ import annotations

import json
import os
import runpy

#: Share of a GPU's memory that each server may claim: a session keeps up to four
#: monolithic servers and an attention server on its attention GPU, and parallel sessions
#: (see ``ROLE_GPUS_ENV``) may share a GPU.
GPU_MEMORY_UTILIZATION = "0.1"
#: Names the physical GPUs of a session's roles, "ATTENTION,FFN" (default "0,1"), so that
#: several pytest sessions can run side by side on a host with more GPUs.
ROLE_GPUS_ENV = "AFD_E2E_ROLE_GPUS"


def harness_cli_args(mla: bool = False) -> tuple[str, ...]:
    """``HARNESS_CLI_ARGS`` of ``$GPU_HARNESS_SETTINGS`` (``HARNESS_MLA_CLI_ARGS`` for an
    MLA model such as DeepSeek-V2), or nothing when it is unset."""
    path = os.environ.get("GPU_HARNESS_SETTINGS")
    if not path:
        return ()
    return tuple(runpy.run_path(path)["HARNESS_MLA_CLI_ARGS" if mla else "HARNESS_CLI_ARGS"])


def server_args(
    graphs: bool = False, graph_mode: str = "FULL_DECODE_ONLY", mla: bool = False
) -> tuple[str, ...]:
    """The extra command-line arguments of every server of this suite.

    ``graphs``: capture CUDA graphs in vLLM's ``cudagraph_mode`` ``graph_mode`` (the
    harness's eager flag dropped, the mode merged into its compilation config); the
    server must then be started without ``--enforce-eager``. ``mla``: the model uses
    MLA attention (DeepSeek), which the harness runs with other backends.
    """
    args = list(harness_cli_args(mla))
    if graphs:
        args = with_cuda_graphs(args, graph_mode)
    return (*args, "--gpu-memory-utilization", GPU_MEMORY_UTILIZATION)


def with_cuda_graphs(args: list[str], mode: str = "FULL_DECODE_ONLY") -> list[str]:
    """``args`` without ``--enforce-eager`` and with ``cudagraph_mode`` ``mode``."""
    args = [a for a in args if a != "--enforce-eager"]
    flag = "--compilation-config"
    if flag in args:
        i = args.index(flag) + 1
        config = json.loads(args[i]) | {"cudagraph_mode": mode}
        args[i] = json.dumps(config)
    else:
        args += [flag, json.dumps({"cudagraph_mode": mode})]
    return args


def role_gpus() -> tuple[str, str]:
    """Physical ids of the attention GPU and the FFN GPU, from ``$AFD_E2E_ROLE_GPUS``.

    Monolithic servers run on the attention GPU; with a CPU connector both roles do.
    """
    value = os.environ.get(ROLE_GPUS_ENV, "0,1")
    ids = [part.strip() for part in value.split(",")]
    if len(ids) != 2 or not all(i.isdigit() for i in ids) or ids[0] == ids[1]:
        raise ValueError(
            f"${ROLE_GPUS_ENV}={value!r}: give two different GPU ids, attention first, e.g. 2,3"
        )
    return ids[0], ids[1]


def role_env(one_gpu_per_role: bool) -> dict[str, dict[str, str]]:
    """``DeploymentSpec.role_env`` placing the roles on :func:`role_gpus`.

    ``one_gpu_per_role``: FFN on its own GPU (NCCL cannot pair two processes on one GPU);
    otherwise both roles share the attention GPU.
    """
    attention, ffn = role_gpus()
    return {
        "attention": {"CUDA_VISIBLE_DEVICES": attention},
        "ffn": {"CUDA_VISIBLE_DEVICES": ffn if one_gpu_per_role else attention},
    }


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
