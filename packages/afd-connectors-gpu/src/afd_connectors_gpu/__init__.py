"""GPU connectors (NCCL point-to-point, DeepEP) for Attention-FFN Disaggregation (AFD) in
vLLM. torch comes with vLLM.
"""

__version__ = "0.3.0"
