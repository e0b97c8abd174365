"""afd-attention's start-up checks (its ``afd_validate`` hook) against a fake vLLM config:
what it reads on each platform (the stage and graph rules themselves are
``afd_core.capabilities``'s, tests/unit/core/test_capabilities.py)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from afd_attention import hooks
from afd_core.errors import AFDConfigError
from afd_core.plugins.specs import ConnectorSpec
from tests.unit.roles.fakes import make_config

TWO_STAGES = replace(make_config("attention"), num_stages=2)
RECORDING = ConnectorSpec("Recording", "tests.unit.roles.fakes:RecordingConnector", ("cpu", "cuda"))


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry holds the recording connector only."""
    monkeypatch.setattr(
        hooks, "get_registry", lambda: SimpleNamespace(connector=lambda n: RECORDING)
    )


class NoRunnerProperty:
    """A vLLM config whose ``use_v2_model_runner`` must not be read (off CUDA)."""

    def __init__(self, cudagraph_mode: object) -> None:
        self.parallel_config = SimpleNamespace(
            tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1
        )
        self.compilation_config = SimpleNamespace(cudagraph_mode=cudagraph_mode)

    @property
    def use_v2_model_runner(self) -> bool:
        raise AssertionError("use_v2_model_runner read off CUDA")


class CudaConfig(NoRunnerProperty):
    def __init__(self, cudagraph_mode: str, use_v2: bool, use_mla: bool = False) -> None:
        super().__init__(SimpleNamespace(name=cudagraph_mode))
        self._use_v2 = use_v2
        self.model_config = SimpleNamespace(use_mla=use_mla)

    @property
    def use_v2_model_runner(self) -> bool:
        return self._use_v2


def test_off_cuda_two_stages_pass_without_reading_the_runner_or_graph_mode(monkeypatch):
    monkeypatch.setattr(hooks, "current_platform_name", lambda: "cpu")
    hooks.afd_validate(config=TWO_STAGES, vllm_config=NoRunnerProperty(cudagraph_mode=None))


def test_on_cuda_two_stages_need_eager_forwards_and_on_v2_no_mla(monkeypatch):
    monkeypatch.setattr(hooks, "current_platform_name", lambda: "cuda")
    hooks.afd_validate(config=TWO_STAGES, vllm_config=CudaConfig("NONE", use_v2=False))
    hooks.afd_validate(config=TWO_STAGES, vllm_config=CudaConfig("NONE", use_v2=True))
    per_stage = replace(TWO_STAGES, stage_streams="per-stage")
    hooks.afd_validate(config=per_stage, vllm_config=CudaConfig("NONE", use_v2=False))
    hooks.afd_validate(config=per_stage, vllm_config=CudaConfig("NONE", use_v2=True))
    mla_v1 = CudaConfig("NONE", use_v2=False, use_mla=True)
    hooks.afd_validate(config=TWO_STAGES, vllm_config=mla_v1)
    with pytest.raises(AFDConfigError, match="not supported for MLA models"):
        hooks.afd_validate(config=TWO_STAGES, vllm_config=CudaConfig("NONE", True, use_mla=True))
    with pytest.raises(AFDConfigError, match="--enforce-eager"):
        hooks.afd_validate(
            config=TWO_STAGES, vllm_config=CudaConfig("FULL_DECODE_ONLY", use_v2=False)
        )
