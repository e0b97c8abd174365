# vllm_ascend/worker/model_runner_v1.py @ 182b75ea84 (NPUModelRunner, :291-4862)
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.sequence import IntermediateTensors
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None: ...
    # :2629-2659: the padded token count comes first, and callers pass it by position.
    # vLLM 0.32's GPUModelRunner._model_forward has no such argument, hence the ignore.
    def _model_forward(  # type: ignore[override]
        self,
        num_tokens_padded: int,
        input_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **model_kwargs: Any,
    ) -> Any: ...
