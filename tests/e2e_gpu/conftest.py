"""Fixtures of the CUDA end-to-end tests: real vLLM servers on a GPU, tiny models.

Every test here needs a CUDA device and skips without one. On the lent H200 machines the
pure-Python vLLM of the gpu-harness only runs with the engine arguments of its
``settings.py``: when ``$GPU_HARNESS_SETTINGS`` names that file, its ``HARNESS_CLI_ARGS``
go to every server (monolithic and AFD alike); on an ordinary CUDA install nothing is
added. Monolithic servers run on the session's attention GPU (``gpu_settings.role_gpus``);
servers share GPUs, so each claims a small share of a GPU's memory.

Helpers come from the CPU suite: the ``tiny_models`` and ``vllm_cache_root`` fixtures
(``tests/e2e_cpu/conftest.py``), monolithic servers, completions and the leak check
(``tests/e2e_cpu/harness.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from afd_core.tools.launch.processes import kill_session
from tests.e2e_cpu.conftest import tiny_models, vllm_cache_root
from tests.e2e_cpu.harness import MonolithicServers, build_tiny_models, leftover_processes
from tests.e2e_gpu.gpu_settings import cuda_device_count, role_gpus, server_args

__all__ = ["tiny_models", "vllm_cache_root"]  # shared fixtures, registered here too


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: starts real vLLM servers on a GPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "e2e_gpu" in item.nodeid:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the generator's wide family (``wide-qwen3-moe``, ``wide-deepseek-v2``:
    hidden 256, 16 experts top-4), built once per session on first use."""
    return build_tiny_models(tmp_path_factory.mktemp("wide-models"), family="wide")


@pytest.fixture(scope="session")
def monolithic_servers(
    tmp_path_factory: pytest.TempPathFactory, vllm_cache_root: Path
) -> Iterator[MonolithicServers]:
    """Plain vLLM servers per (model, eager, runner), reused by every module."""
    attention_gpu, _ = role_gpus()
    servers = MonolithicServers(
        tmp_path_factory.mktemp("monolithic-logs"),
        vllm_cache_root,
        extra_args=server_args(),
        base_env={"CUDA_VISIBLE_DEVICES": attention_gpu},
    )
    yield servers
    servers.stop_all()


@pytest.fixture(scope="module", autouse=True)
def no_leaked_processes(monolithic_servers: MonolithicServers) -> Iterator[None]:
    """Fail the module if a server it launched outlives it (and kill what is left)."""
    yield
    leaked = leftover_processes(keep=monolithic_servers.sessions)
    for sid in leaked:
        kill_session(sid)
    assert not leaked, f"processes of launched servers still running: {leaked}"
