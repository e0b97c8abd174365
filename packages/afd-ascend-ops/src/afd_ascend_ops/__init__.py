"""The ``a2e``/``e2a`` and CAM dispatch/combine operators of Attention-FFN Disaggregation
(AFD) as torch ops, with CPU reference kernels. torch comes from the environment.
"""

__version__ = "0.2.0"
