"""CAM P2P's FFN side makes the tensors of its ``a2e`` receive on the op plane's device, so
an FFN rank on NPU reaches the NPU kernels (the CPU kernels would run on CPU tensors); and
the op plane follows vLLM's platform. The ``meta`` device stands for the NPU here: the
ops' fake kernels run there, and would not see a CPU tensor among their inputs."""

from __future__ import annotations

import sys
import types

import pytest

from afd_connectors_npu import providers
from afd_connectors_npu.cam_ops import CamP2pOps

torch = pytest.importorskip("torch")


def test_the_ffn_receive_runs_on_the_op_device() -> None:
    import afd_ascend_ops.ops  # noqa: F401  (registers the ops and their fake kernels)

    ops = CamP2pOps(rank=0, num_ffn_ranks=1, num_attention_ranks=2, hidden_size=8, cores=0,
                    device="meta")  # fmt: skip
    hidden, sizes = ops.ffn_receive([3, -1], 3, torch.bfloat16, "group")
    assert (hidden.device.type, tuple(hidden.shape), hidden.dtype) == ("meta", (3, 8),
                                                                       torch.bfloat16)  # fmt: skip
    assert sizes.device.type == "meta"


@pytest.mark.parametrize("platform", ["npu", "cpu", "cuda"])
def test_the_op_device_follows_vllms_loaded_platform(monkeypatch, platform) -> None:
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.ModuleType("vllm.platforms"))
    monkeypatch.setattr(providers, "current_platform_name", lambda: platform)
    assert providers.op_device() == ("npu" if platform == "npu" else "cpu")


def test_without_vllms_platform_loaded_the_reference_runs(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm.platforms", raising=False)
    assert providers.op_device() == "cpu"
    assert type(providers.cam_p2p_provider()).__name__ == "ReferenceOpProvider"
