# The compiled extension afd_ascend_ops._C (csrc/binding/afd_ascend_npu.cpp), built only by
# the kernel build (AFD_BUILD_ASCEND_OPS); importing it registers the PrivateUse1 kernels of
# afd_ascend::a2e/e2a. These are its Python functions, for the type check of npu_provider.
from typing import Any

def open_group(
    group_ep: str,
    anchor: Any,
    expert_rank_size: int,
    attention_rank_size: int,
    rank: int,
    timeout_s: float,
    stages: int,
) -> None: ...
def interrupt(group_ep: str) -> None: ...
def close_group(group_ep: str) -> None: ...
