"""Fixtures of the CPU end-to-end tests (real vLLM servers, tiny models); see harness.py.

Every module here is checked for leaked processes when it ends: a server it launched
that still runs fails the check (and is killed), except the session's monolithic
servers, which are stopped when the session ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from afd_core.tools.launch.processes import kill_session
from tests.e2e_cpu.harness import MonolithicServers, build_tiny_models, leftover_processes


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts real vLLM servers (about 30-60 s each on 2 CPU cores)"
    )
    config.addinivalue_line(
        "markers",
        "extended: a further variant of a behaviour CI covers (another model, layout, start "
        "order or signal); CI deselects it, `nox -s e2e_extended` runs it",
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the tiny checkpoints, built once per session."""
    return build_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def vllm_cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``VLLM_CACHE_ROOT`` shared by every server of the session (warm model-info cache)."""
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="session")
def monolithic_servers(
    tmp_path_factory: pytest.TempPathFactory, vllm_cache_root: Path
) -> Iterator[MonolithicServers]:
    """Plain vLLM servers per (model, eager), reused by every module of the session."""
    servers = MonolithicServers(tmp_path_factory.mktemp("monolithic-logs"), vllm_cache_root)
    yield servers
    servers.stop_all()


@pytest.fixture(scope="module", autouse=True)
def no_leaked_processes(monolithic_servers: MonolithicServers) -> Iterator[None]:
    """Fail the module if a server it launched outlives it (and kill what is left).

    Runs after the module's other fixtures are torn down; the session's monolithic
    servers are meant to keep running and are not counted.
    """
    yield
    leaked = leftover_processes(keep=monolithic_servers.sessions)
    for sid in leaked:
        kill_session(sid)
    assert not leaked, f"processes of launched servers still running: {leaked}"
