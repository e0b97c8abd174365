"""afd-ffn's start-up checks (its ``afd_validate`` hook) against a fake vLLM config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from afd_core.errors import AFDConfigError
from afd_ffn.hooks import afd_validate
from tests.unit.roles.fakes import make_config


def vllm_config(profiler: str | None) -> SimpleNamespace:
    parallel = SimpleNamespace(
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_parallel_size=1,
        enable_expert_parallel=False,
    )
    return SimpleNamespace(
        parallel_config=parallel, profiler_config=SimpleNamespace(profiler=profiler)
    )


@pytest.mark.parametrize("profiler", [None, "torch"])
def test_the_ffn_role_accepts_no_profiler_or_torchs(profiler: str | None) -> None:
    afd_validate(config=make_config("ffn"), vllm_config=vllm_config(profiler))


def test_another_profiler_on_the_ffn_role_is_a_start_up_error_naming_it() -> None:
    with pytest.raises(AFDConfigError, match=r"profiler is 'cuda'.*profiler=torch"):
        afd_validate(config=make_config("ffn"), vllm_config=vllm_config("cuda"))
    # The attention role runs vLLM's own profilers, whichever is chosen.
    afd_validate(config=make_config("attention"), vllm_config=vllm_config("cuda"))
