"""``ProtocolMembers``: what the halves of the P2P protocol share, declared once.

:class:`~afd_core.connectors.p2p_protocol.P2pProtocolConnector` is assembled from mixins
(:mod:`~afd_core.connectors.p2p_attention`, :mod:`~afd_core.connectors.p2p_ffn`,
:mod:`~afd_core.connectors.p2p_graph`). Each mixin derives from this class, which only
declares (annotations, no values) the state and primitives the protocol class sets up and
the transport implements, so a reader of one half sees what it relies on.
"""

from __future__ import annotations

from typing import Any

from afd_core.errors import AFDError


class ProtocolMembers:
    """Declarations only; see the module docstring and ``P2pProtocolConnector``."""

    # Set by Connector / P2pProtocolConnector.__init__ and _start_protocol.
    config: Any
    role_rank: int
    wire: Any
    topology: Any
    name: str
    _closed: Any
    _failure: AFDError | None
    _torch: Any
    _timeout_s: float
    _headers: Any
    _buffers: Any
    _slots: dict[Any, Any]
    _dtype: Any
    _logits_dtype: Any
    _recv_reply_first: bool
    # Attention side.
    _inflight: dict[int, tuple[Any, ...]]
    _announced: tuple[int, tuple[int, ...]] | None
    _exchanges: int
    _expected_exchanges: int
    _graph_step: bool
    _control_frame: Any
    _ffn_rank: int
    _ffn_world: int
    # FFN side.
    _inbox: Any
    _plans: dict[int, Any]
    _attention_world: dict[int, int]
    # Transport primitives and shared helpers (methods of the protocol class).
    _post_send: Any
    _post_recv: Any
    _wait: Any
    _read_bytes: Any
    _write_bytes: Any
    _fail: Any
    _raise_unusable: Any
    _reject_rows: Any
