# vllm_ascend/worker/v2/model_runner.py @ 182b75ea84 (NPUModelRunner, :70-219)
import torch
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

class NPUModelRunner(GPUModelRunner):
    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None: ...
