"""Role-aware model wrappers for Attention-FFN Disaggregation (AFD) in vLLM.

Wrappers that split a decoder between the attention role and the FFN role, the
per-layer exchange op and the tiny-model generator used by the tests.
"""

__version__ = "0.3.0"
