"""Ascend NPU connectors (CAM point-to-point and asynchronous) for Attention-FFN
Disaggregation (AFD) in vLLM.
"""

__version__ = "0.3.0"
