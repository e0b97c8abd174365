"""Attention-role workers and model runners for Attention-FFN Disaggregation (AFD) in vLLM."""

__version__ = "0.3.0"
