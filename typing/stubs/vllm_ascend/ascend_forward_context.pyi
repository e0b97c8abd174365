# vllm_ascend/ascend_forward_context.py @ 182b75ea84 (:58-75)
from contextlib import AbstractContextManager
from typing import Any

import torch
from vllm.config import VllmConfig

def set_ascend_forward_context(
    attn_metadata: Any,
    vllm_config: VllmConfig,
    virtual_engine: int = 0,
    num_tokens: int = 0,
    num_tokens_across_dp: torch.Tensor | None = None,
    in_profile_run: bool = False,
    num_actual_tokens: int | None = None,
    aclgraph_runtime_mode: Any = None,
    batch_descriptor: Any = None,
    model_instance: Any = None,
) -> AbstractContextManager[None]: ...
