"""The GPU suite's settings: engine flags for CUDA graphs and where each role runs."""

from __future__ import annotations

import json

import pytest

from tests.e2e_gpu.gpu_settings import ROLE_GPUS_ENV, role_env, role_gpus, with_cuda_graphs


def test_graphs_drop_the_eager_flag_and_keep_the_harness_compilation_config() -> None:
    args = ["--enforce-eager", "--compilation-config", '{"mode": 0}', "--dtype", "bfloat16"]
    got = with_cuda_graphs(args)
    assert "--enforce-eager" not in got
    config = json.loads(got[got.index("--compilation-config") + 1])
    assert config == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert got[-2:] == ["--dtype", "bfloat16"]


def test_graphs_add_a_compilation_config_when_there_is_none() -> None:
    got = with_cuda_graphs(["--dtype", "bfloat16"], "FULL")
    assert json.loads(got[got.index("--compilation-config") + 1]) == {"cudagraph_mode": "FULL"}


def test_roles_default_to_gpus_0_and_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROLE_GPUS_ENV, raising=False)
    assert role_gpus() == ("0", "1")
    assert role_env(one_gpu_per_role=True) == {
        "attention": {"CUDA_VISIBLE_DEVICES": "0"},
        "ffn": {"CUDA_VISIBLE_DEVICES": "1"},
    }


def test_a_cpu_connector_puts_both_roles_on_the_attention_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ROLE_GPUS_ENV, "3, 2")
    assert role_env(one_gpu_per_role=False) == {
        "attention": {"CUDA_VISIBLE_DEVICES": "3"},
        "ffn": {"CUDA_VISIBLE_DEVICES": "3"},
    }


@pytest.mark.parametrize("value", ["1", "1,1", "a,b", "0,1,2"])
def test_a_bad_gpu_pair_is_refused_with_an_example(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ROLE_GPUS_ENV, value)
    with pytest.raises(ValueError, match="two different GPU ids"):
        role_gpus()
