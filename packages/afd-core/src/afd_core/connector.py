"""The connector contract: how the attention role and the FFN role exchange data.

A connector is one rank's endpoint. Its life cycle:

1. ``__init__`` stores the configuration and parses ``connector_extra_config`` strictly;
   it creates **no** communication resources (so it can be built anywhere, for example
   by ``afd check``).
2. :meth:`Connector.initialize` performs the rendezvous with the peers, checks that both
   sides agree on configuration and model shape, and creates the process groups. It is
   idempotent and bounded by ``afd_process_group_timeout_s``.
3. Data-plane calls, per decoder layer and stage (see below).
4. :meth:`Connector.close` releases everything; it is idempotent, safe before
   :meth:`initialize` and after a half-finished one, and wakes up any thread blocked in a
   connector call (that call raises :class:`~afd_core.errors.AFDShutdown`).

Per step the attention rank sends one :class:`~afd_core.metadata.ControlPayload`
through :attr:`Connector.control_plane`, then for every exchanging layer calls
:meth:`Connector.send_hidden` and :meth:`Connector.recv_output`. The FFN rank obtains
the step with ``control_plane.recv_step()`` and for every layer calls
:meth:`Connector.recv_hidden` (the tokens of its whole block, concatenated) and
:meth:`Connector.send_output` (split back per attention rank).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from afd_core.errors import AFDConfigError
from afd_core.metadata import ControlPayload, TransferHeader

if TYPE_CHECKING:
    import torch

    from afd_core.config import AFDConfig


@dataclass(frozen=True)
class WireSpec:
    """The shapes both roles must agree on; part of the rendezvous check.

    ``num_exchange_layers``: decoder layers that exchange per step. ``router_logits_width``
    is the number of routed experts when the gate runs on attention, else 0.
    ``dense_layers``: layers with a dense MLP (no router), whose messages never carry
    router logits (DeepSeek's first ``first_k_dense_replace`` layers).
    ``model_fingerprint`` identifies the checkpoint (architecture and sizes).
    """

    hidden_size: int
    dtype: str
    num_exchange_layers: int
    router_logits_width: int = 0
    router_logits_dtype: str = "float32"
    model_fingerprint: str = ""
    dense_layers: tuple[int, ...] = ()

    def logits_width_at(self, layer: int) -> int:
        """Router-logit columns of ``layer``'s attention-to-FFN message (0: none)."""
        return 0 if layer in self.dense_layers else self.router_logits_width


@dataclass(frozen=True)
class FFNStep:
    """One step as the FFN rank runs it: the attention ranks taking part and their counts.

    ``payloads`` are in block order; ``tokens[i][s]`` is the token count of
    ``attention_ranks[i]`` in stage ``s``.
    """

    payloads: tuple[ControlPayload, ...]
    attention_ranks: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]

    @property
    def num_stages(self) -> int:
        """Stages of this step (the same for every taking part attention rank)."""
        return len(self.tokens[0])

    @property
    def is_warmup(self) -> bool:
        """Any taking part rank runs a warm-up forward."""
        return any(p.is_warmup for p in self.payloads)

    @property
    def is_graph_capturing(self) -> bool:
        """Any taking part rank captures a CUDA graph."""
        return any(p.is_graph_capturing for p in self.payloads)

    @property
    def is_profile(self) -> bool:
        """Any taking part rank runs a profiling forward."""
        return any(p.is_profile for p in self.payloads)

    @property
    def is_graph_step(self) -> bool:
        """The taking part ranks run (or capture) CUDA graphs: header-less data messages.

        A step never mixes graph and eager ranks (the FFN side forms steps of one kind).
        """
        return self.payloads[0].is_graph_step

    def stage_tokens(self, stage: int) -> tuple[int, ...]:
        """Token counts of every taking part rank in ``stage``, block order."""
        return tuple(t[stage] for t in self.tokens)


@dataclass
class FFNLayerBatch:
    """The FFN input of one layer and stage: the block's tokens, concatenated.

    ``splits[i]`` tokens belong to ``step.attention_ranks[i]``; ``headers`` are the
    received (already checked) headers in the same order.
    """

    step: FFNStep
    layer: int
    stage: int
    hidden: torch.Tensor
    router_logits: torch.Tensor | None
    splits: tuple[int, ...]
    headers: tuple[TransferHeader, ...]


class ControlPlane(ABC):
    """The per-step control channel (attention -> FFN)."""

    @abstractmethod
    def send_step(self, payload: ControlPayload) -> None:
        """Attention side: send this step's payload to the FFN rank serving this rank.

        Must be called before the step's first :meth:`Connector.send_hidden`.
        """

    @abstractmethod
    def recv_step(self) -> FFNStep | None:
        """FFN side: wait for the next step of the block and return it.

        Waits as long as the attention ranks are idle, but wakes up on :meth:`close` and
        then returns ``None``. Raises AFDPeerError if an attention rank disconnects and
        AFDProtocolError for a payload that is not a valid control message.
        """


class Connector(ABC):
    """Base class of every AFD connector (built-in and third-party).

    Subclasses set ``name`` (the value users put in ``"connector"``), implement the
    ``_initialize``/``_close`` pair and the four data-plane methods, and may override
    :meth:`parse_extra_config` to accept ``connector_extra_config`` fields.
    """

    name: ClassVar[str] = ""

    def __init__(self, config: AFDConfig, role_rank: int, wire: WireSpec) -> None:
        self.config = config
        self.role_rank = role_rank
        self.wire = wire
        self.topology = config.topology
        self.world_rank = self.topology.world_rank(config.role, role_rank)
        self.extra = type(self).parse_extra_config(config.connector_extra_config)
        self._lifecycle_lock = threading.Lock()
        self._initialized = False
        self._closed = threading.Event()

    @classmethod
    def parse_extra_config(cls, raw: Mapping[str, Any]) -> Any:
        """Parse ``connector_extra_config`` strictly; the default accepts only ``{}``.

        Raise AFDConfigError naming each unknown field.
        """
        if raw:
            raise AFDConfigError(
                f"AFD config: connector_extra_config has fields {sorted(raw)} but "
                f"{cls.name or cls.__name__} takes none; remove them"
            )
        return None

    @property
    def is_initialized(self) -> bool:
        """True once :meth:`initialize` has completed (and :meth:`close` not yet run)."""
        return self._initialized

    @property
    def is_closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed.is_set()

    def initialize(self) -> None:
        """Rendezvous with the peers and create the communication resources (idempotent)."""
        with self._lifecycle_lock:
            if self._initialized:
                return
            if self._closed.is_set():
                raise RuntimeError(f"{type(self).__name__} was closed; build a new connector")
            self._initialize()
            self._initialized = True

    def close(self) -> None:
        """Release every resource and wake blocked callers (idempotent, safe any time).

        The closed flag is set before the lifecycle lock is taken, so a thread blocked in a
        data-plane wait (which polls :attr:`is_closed`) returns with AFDShutdown.
        """
        self._closed.set()
        with self._lifecycle_lock:
            self._close()
            self._initialized = False

    @abstractmethod
    def _initialize(self) -> None:
        """Do the rendezvous; called at most once, under the lifecycle lock."""

    @abstractmethod
    def _close(self) -> None:
        """Release resources; must tolerate any partial state of ``_initialize``."""

    @property
    @abstractmethod
    def control_plane(self) -> ControlPlane:
        """The control channel of this connector."""

    # Attention side -------------------------------------------------------------------

    @abstractmethod
    def send_hidden(
        self,
        header: TransferHeader,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None = None,
    ) -> None:
        """Send one layer's hidden states (and router logits) to the serving FFN rank."""

    @abstractmethod
    def recv_output(self, header: TransferHeader, out: torch.Tensor) -> torch.Tensor:
        """Receive the FFN result for ``header``'s layer and stage into ``out``; return it.

        The received header is checked against ``header`` (direction f2a).
        """

    # FFN side -------------------------------------------------------------------------

    @abstractmethod
    def recv_hidden(self, step: FFNStep, layer: int, stage: int) -> FFNLayerBatch:
        """Receive one layer's input from every attention rank of ``step``, concatenated."""

    @abstractmethod
    def send_output(self, batch: FFNLayerBatch, output: torch.Tensor) -> None:
        """Split ``output`` by ``batch.splits`` and send each part back to its rank."""

    # CUDA graph steps (connectors registered with supports_cuda_graphs) ----------------
    #
    # In a step whose control payload has ``is_graph_step`` the attention rank's forward
    # is a CUDA graph: ``send_hidden``/``recv_output`` run once, while the graph is
    # captured, and each replay repeats their device work with no Python. Its data
    # messages carry no header; the step and token counts were checked on the control
    # plane. The FFN rank serves such a step with the methods below, which take
    # buffers the caller owns (so that a graph the FFN rank captures keeps fixed
    # addresses) and which may themselves be captured.

    def recv_hidden_into(
        self,
        step: FFNStep,
        layer: int,
        stage: int,
        hidden: torch.Tensor,
        router_logits: torch.Tensor | None,
    ) -> None:
        """FFN side, graph step: receive ``layer``'s input of every rank into ``hidden``.

        ``hidden`` holds the block's rows in block order (``sum(step.stage_tokens(stage))``
        rows); ``router_logits`` likewise, exactly when the wire spec has router logits
        at ``layer``. Waits are bounded unless the current stream is being captured.
        """
        raise NotImplementedError(f"{self.name} does not support CUDA graph steps")

    def send_output_from(self, step: FFNStep, layer: int, stage: int, output: torch.Tensor) -> None:
        """FFN side, graph step: send each rank's rows of ``output`` back to it."""
        raise NotImplementedError(f"{self.name} does not support CUDA graph steps")

    def wait_for_stream(self, what: str) -> None:
        """Wait until the current stream's queued work is done, within the AFD timeout.

        FFN side: called after replaying a captured step. Raises AFDPeerError (and
        closes the connector, ending the pending transfers) when it takes longer than
        ``afd_process_group_timeout_s``, AFDShutdown when the connector is closed.
        """
        raise NotImplementedError(f"{self.name} does not support CUDA graph steps")

    def graph_capture(self) -> AbstractContextManager[None]:
        """Attention side: a context around the capture of CUDA graphs in this process.

        Entering waits (bounded) for the replays still running; inside, the connector
        makes no CUDA call from its own threads (a capture in vLLM's global mode forbids
        them in every thread of the process). The runners enter it around every capture
        routine, also when it captures nothing; the default does nothing (a connector
        without graph steps has no replays and no CUDA calls to hold back).
        """
        return nullcontext()

    def watch_graph_replay(self, step_id: int) -> None:
        """Attention side: bound the graph replay of ``step_id`` just queued on the stream.

        Returns at once. Should the replay not finish within the AFD timeout (the FFN
        rank stopped answering), the connector fails and ends its pending transfers, so
        the replay finishes and the next call raises AFDPeerError.
        """
        raise NotImplementedError(f"{self.name} does not support CUDA graph steps")
