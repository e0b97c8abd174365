"""The attention role refuses CUDA graphs with a connector whose data plane cannot be captured."""

from __future__ import annotations

from enum import Enum

import pytest

from afd_attention.hooks import check_cuda_graphs
from afd_core.errors import AFDConfigError
from afd_core.specs import ConnectorSpec


class Mode(Enum):
    """The names of vLLM's CUDAGraphMode that matter here."""

    NONE = 0
    PIECEWISE = 1
    FULL_DECODE_ONLY = 2
    FULL = 3
    FULL_AND_PIECEWISE = 4


def spec(supports_cuda_graphs: bool) -> ConnectorSpec:
    return ConnectorSpec(
        name="C", target="m:C", platforms=("cuda",), supports_cuda_graphs=supports_cuda_graphs
    )


@pytest.mark.parametrize("mode", [Mode.PIECEWISE, Mode.FULL_DECODE_ONLY])
def test_a_captured_mode_with_a_connector_without_graph_support_is_rejected(mode):
    with pytest.raises(AFDConfigError, match=r"--enforce-eager") as info:
        check_cuda_graphs(spec(False), mode)
    assert mode.name in str(info.value)


def test_eager_forwards_accept_any_connector():
    check_cuda_graphs(spec(False), Mode.NONE)


@pytest.mark.parametrize("mode", [Mode.FULL_DECODE_ONLY, Mode.FULL])
def test_a_connector_with_graph_support_may_be_captured_whole(mode):
    check_cuda_graphs(spec(True), mode)


@pytest.mark.parametrize("mode", [Mode.PIECEWISE, Mode.FULL_AND_PIECEWISE])
def test_piecewise_graphs_are_rejected_even_with_graph_support(mode):
    with pytest.raises(AFDConfigError, match=r"captures pieces of the forward.*FULL_DECODE_ONLY"):
        check_cuda_graphs(spec(True), mode)


def test_graphs_with_data_parallel_attention_are_rejected():
    with pytest.raises(AFDConfigError, match=r"data_parallel_size 2 are not supported"):
        check_cuda_graphs(spec(True), Mode.FULL_DECODE_ONLY, data_parallel_size=2)
    check_cuda_graphs(spec(True), Mode.NONE, data_parallel_size=2)


def test_graphs_with_tensor_parallel_attention_are_rejected_naming_eager():
    with pytest.raises(AFDConfigError, match=r"tensor_parallel_size 2 are not supported") as info:
        check_cuda_graphs(spec(True), Mode.FULL_DECODE_ONLY, tensor_parallel_size=2)
    assert "--enforce-eager" in str(info.value)
    check_cuda_graphs(spec(True), Mode.NONE, tensor_parallel_size=2)
