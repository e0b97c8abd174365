"""What the attention and FFN role workers share (afd-attention, afd-ffn use it).

* :mod:`~afd_core.workers.setup`: the role rank, the model's wire spec, the connector;
* :mod:`~afd_core.workers.frontend`, :mod:`~afd_core.workers.process_exit`,
  :mod:`~afd_core.workers.startup_signals`, :mod:`~afd_core.workers.procfs`: who
  outlives whom, ending a process after an AFD failure, signals during start-up;
* :mod:`~afd_core.workers.profiling`: AFD ranges in torch profiler traces;
  :mod:`~afd_core.workers.all_threads_profiler`: the torch profiler of every thread.
"""
