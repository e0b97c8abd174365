"""The per-step control channel: attention ranks announce each step to the FFN side.

* :mod:`~afd_core.runtime.control.step_merger`: :class:`StepMerger` turns the payloads an FFN
  rank holds into one :class:`~afd_core.connector.FFNStep` (pure Python);
* :mod:`~afd_core.runtime.control.channel`: :class:`ControlSender` (attention side: one fixed-size
  control message per step) and :class:`ControlInbox` (FFN side: one receiver thread per attention
  rank, steps formed from whatever is queued), over any
  :class:`~afd_core.dataplane.transport.Transport` in host memory;
* :mod:`~afd_core.runtime.control.relay`: :class:`LeadingRelay` and :class:`FollowingRelay` for
  connectors whose FFN ranks must all run the same steps (expert-routed M:N): FFN rank 0
  forms each step and forwards it to the other FFN ranks.

A connector with no control plane (whose data messages carry their own counts) builds
none of these.
"""
