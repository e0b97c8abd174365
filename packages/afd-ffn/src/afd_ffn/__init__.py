"""FFN-role workers and the connector-driven FFN runner for Attention-FFN Disaggregation
(AFD) in vLLM.
"""

__version__ = "0.3.0"
