"""AFD's tools for operators, outside the contract: the ``afd`` command
(:mod:`~afd_core.tools.cli`), local deployments and the prefill proxy
(:mod:`~afd_core.tools.launch`) and the CPU demo (:mod:`~afd_core.tools.demo`).
"""
