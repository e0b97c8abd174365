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


def test_a_connector_with_graph_support_may_be_captured():
    check_cuda_graphs(spec(True), Mode.FULL_DECODE_ONLY)
