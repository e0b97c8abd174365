"""The op providers of the Ascend connectors, chosen by platform.

On Ascend NPU (vLLM's platform is vllm-ascend's): afd-ascend-ops' HCCL provider and the
compiled kernels (``afd_ascend_ops.npu_provider``, hardware-unverified; it imports
torch-npu, so it is imported only there). Everywhere else: its CPU reference provider
(gloo groups, the reference kernels). Importing this module imports no torch.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from afd_core.platform import current_platform_name

if TYPE_CHECKING:
    from afd_ascend_ops.reference.provider import OpFamily
    from afd_core.dataplane.op_provider import OpProvider


def runs_on_npu() -> bool:
    """Whether this process runs vLLM on Ascend NPU.

    A vLLM worker loads vLLM's platform before it builds a connector; a process that has
    not (a test or tool driving a connector directly) runs the reference kernels.
    """
    return "vllm.platforms" in sys.modules and current_platform_name() == "npu"


def op_device() -> str:
    """The device of the op plane's tensors on this process's platform: ``"npu"`` where
    the HCCL provider runs (the compiled kernels take NPU tensors), else ``"cpu"``."""
    return "npu" if runs_on_npu() else "cpu"


def provider_of(family: OpFamily) -> OpProvider:
    """The provider of ``family``'s ops on this process's platform."""
    if runs_on_npu():
        from afd_ascend_ops.npu_provider import HcclOpProvider

        return HcclOpProvider(family)
    from afd_ascend_ops.reference import ReferenceOpProvider

    return ReferenceOpProvider(family)


def cam_p2p_provider() -> OpProvider:
    """The provider of ``a2e``/``e2a`` (CAMP2pAFDConnector's op plane)."""
    return provider_of("p2p")


def cam_async_provider() -> OpProvider:
    """The provider of the CAM async ops (CAMAsyncAFDConnector's op plane)."""
    return provider_of("async")
