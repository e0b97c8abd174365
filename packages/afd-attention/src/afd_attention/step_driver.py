"""The attention side of the per-layer exchange: one :class:`StepDriver` per attention rank.

The model's exchange op (``torch.ops.afd.exchange``) calls :meth:`StepDriver.exchange` at
every exchanging decoder layer of every forward. A *step* is one forward: the driver
numbers steps, installs :class:`~afd_core.wire.metadata.AFDStepMetadata` at
``forward_context.additional_kwargs["afd_metadata"]``, begins the step on the connector's
attention endpoint with its :class:`~afd_core.wire.metadata.ControlPayload`, then per layer
sends the hidden states (and router logits or routing) and receives the FFN output. The
endpoint owns the wire format: the driver never builds a header.

A step begins either explicitly (:meth:`StepDriver.begin_step`, called by the runner with
the scheduled token count before the model runs) or lazily at the first exchange of a
forward whose context carries no ``afd_metadata`` (profile, warm-up and dummy runs, which
call the model directly); :meth:`StepDriver.dummy_flags` tells the lazy path why the
forward runs. Every step must exchange every layer of the wire spec exactly once, in
order; the connector's attention endpoint owns that rule (the endpoint contract,
:class:`~afd_core.kit.step_exchanges.StepExchanges`) and raises
:class:`~afd_core.errors.AFDProtocolError` for anything else, so the driver counts no
layers itself: it checks only what the endpoint cannot see (the forward's step metadata
and token count).

Two stages per step: :meth:`StepDriver.begin_stages` announces both stages' token counts
in one control payload and returns each stage's metadata, which the runner installs in
that stage's forward context; each stage then runs the model on its own thread (see
:mod:`afd_attention.stage_scheduler`), and between the send and the receive of every
layer the driver calls its ``after_send`` checkpoint, where the other stage takes over.

CUDA graphs: a step begun while the current stream is being captured is a *capture*
step (``is_graph_capturing``): its exchanges are recorded into the graph, no data flows
and the FFN rank captures its side. A graph *replay* runs no Python, so the runner
announces it with :meth:`StepDriver.replay_step` around the replay; it exchanges no
layer on the host. Both are graph steps (``is_graph_step``): header-less data messages.

Platform independent and free of vLLM and torch imports at module level: the forward
context is injected (its default imports lazily), so the state machine is tested with a
fake connector and fake tensors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from afd_core.connector import Connector, ExpertRouting, WireSpec
from afd_core.errors import AFDProtocolError
from afd_core.metrics import Histogram
from afd_core.wire.metadata import AFDDPMetadata, AFDStepMetadata, ControlPayload
from afd_core.workers.profiling import ATTENTION_BEGIN, ATTENTION_SEND, ATTENTION_WAIT, afd_range

#: Key of the step metadata in ``ForwardContext.additional_kwargs``.
METADATA_KEY = "afd_metadata"

T = TypeVar("T")


@dataclass(frozen=True)
class StepFlags:
    """Why a forward runs; copied into the step's control payload.

    ``is_graph_capturing`` labels the forwards of a graph capture routine; the payload
    says "capturing" only when the stream really is capturing (the routine's warm-up
    forwards run eagerly and go as warm-ups).
    """

    is_warmup: bool = False
    is_graph_capturing: bool = False
    is_profile: bool = False


#: A forward scheduled by vLLM's scheduler (real requests).
SCHEDULED = StepFlags()
#: A forward that no scheduler asked for and nobody labelled (compile or kernel warm-up).
WARMUP = StepFlags(is_warmup=True)


def forward_context_kwargs() -> dict[str, Any]:
    """``additional_kwargs`` of vLLM's current forward context (the default step slot).

    Raises AFDProtocolError when no forward context is set: the exchange op only runs
    inside a model forward, which vLLM always wraps in ``set_forward_context``.
    """
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        raise AFDProtocolError(
            "AFD attention: an exchange ran outside a vLLM forward context; the AFD model "
            "must be called by a vLLM model runner"
        )
    return get_forward_context().additional_kwargs


def stream_is_capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph (False without CUDA)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class ForwardDriver(Protocol):
    """What the attention runner asks of the driver of its forwards: :class:`StepDriver`
    on the rank that talks to the FFN role, :class:`~afd_attention.tensor_parallel.TPFollower`
    on the other tensor-parallel ranks (each method as :class:`StepDriver` documents it)."""

    def dummy_flags(self, flags: StepFlags) -> AbstractContextManager[None]: ...

    def begin_step(self, num_tokens: int, flags: StepFlags = ...) -> object: ...

    def begin_stages(self, stage_tokens: Sequence[int], flags: StepFlags = ...) -> object: ...

    def graph_capture(self) -> AbstractContextManager[None]: ...

    def replay_step(self, num_tokens: int, replay: Callable[[], T]) -> T: ...

    def exchange(
        self, hidden: Any, router_logits: Any | None, layer: int, routing: Any | None = None
    ) -> Any: ...

    def exchange_experts(
        self, hidden: Any, topk_weights: Any, topk_ids: Any, layer: int
    ) -> Any: ...


class StepDriver:
    """Numbers the steps of one attention rank and runs their per-layer exchanges.

    ``connector`` must be initialised before the first step. ``exchange_layers`` is the
    ordered sequence of layer ids the model exchanges per forward (default: the wire
    spec's ``exchange_layers``). ``step_slot`` returns the current forward's
    ``additional_kwargs`` dict and ``is_capturing`` tells whether the current stream is
    being captured (defaults: :func:`forward_context_kwargs`, :func:`stream_is_capturing`).
    ``after_send`` runs between the send and the receive of every exchange (a two-stage
    step's checkpoint; default: nothing). ``share_output`` gets every exchange's result
    before it is returned and returns what the model gets (attention TP: the broadcast
    to the other TP ranks, :mod:`afd_attention.tensor_parallel`; default: the result).

    Not thread-safe: one thread at a time (vLLM's worker thread, or the stage thread that
    holds the turn of a two-stage step).
    """

    def __init__(
        self,
        connector: Connector,
        wire: WireSpec,
        role_rank: int,
        *,
        exchange_layers: Sequence[int] | None = None,
        step_slot: Callable[[], dict[str, Any]] = forward_context_kwargs,
        is_capturing: Callable[[], bool] = stream_is_capturing,
        after_send: Callable[[], None] = lambda: None,
        share_output: Callable[[Any], Any] = lambda out: out,
    ) -> None:
        layers = tuple(wire.exchange_layers if exchange_layers is None else exchange_layers)
        if layers != wire.exchange_layers:
            raise ValueError(
                f"StepDriver: the model exchanges layers {layers} but the wire spec "
                f"announces {wire.exchange_layers}; build the wire spec from the model "
                "(exchange_layer_ids)"
            )
        self._connector = connector
        self._wire = wire
        self._role_rank = role_rank
        self._layers = layers
        self._step_slot = step_slot
        self._is_capturing = is_capturing
        self._after_send = after_send
        self._share_output = share_output
        self._next_step_id = 0
        #: The step begun last (None before the first, and after a replay).
        self._active: AFDStepMetadata | None = None
        self._dummy_flags: StepFlags | None = None
        #: Stages of the active step that exchanged every layer.
        self._stages_done = 0
        #: Steps that exchanged every layer (in every stage), and of them those of two stages.
        self.completed_steps = 0
        self.two_stage_steps = 0
        #: Seconds spent waiting in the endpoint's ``recv`` for the FFN role's results (the
        #: attention rank's idle time in its forwards; with two stages, only the waits of
        #: the stage holding the turn, i.e. while the other stage could not run either).
        self.exchange_wait_s = 0.0
        #: Seconds of each layer's exchange, from its send to its result received (with
        #: two stages the other stage's turn included): the ``afd:`` histogram.
        self.exchange_seconds = Histogram()

    @contextmanager
    def dummy_flags(self, flags: StepFlags) -> Iterator[None]:
        """Label the forwards begun lazily inside this block with ``flags`` (nestable)."""
        previous = self._dummy_flags
        self._dummy_flags = flags
        try:
            yield
        finally:
            self._dummy_flags = previous

    def begin_step(self, num_tokens: int, flags: StepFlags = SCHEDULED) -> AFDStepMetadata:
        """Start the next step: install its metadata and send its control payload.

        Call inside the forward context of the forward that runs the step, before the
        model. On a capturing stream the step is a capture step (see the module
        docstring). The endpoint raises AFDProtocolError when the previous step did not
        exchange every layer (the FFN rank still waits for its remaining layers).
        """
        capturing = self._is_capturing()
        metadata = self._announce((num_tokens,), flags, capturing=capturing, replay=False)
        self._step_slot()[METADATA_KEY] = metadata
        self._active = metadata
        return metadata

    def begin_stages(
        self, stage_tokens: Sequence[int], flags: StepFlags = SCHEDULED
    ) -> tuple[AFDStepMetadata, ...]:
        """Start the next step as ``len(stage_tokens)`` stages; return each stage's metadata.

        Sends one control payload announcing every stage's token count. The caller
        installs metadata ``s`` at ``additional_kwargs["afd_metadata"]`` of the forward
        context stage ``s`` runs in. Eager steps only (a capturing stream raises
        AFDProtocolError); the endpoint raises as :meth:`begin_step` says.
        """
        if self._is_capturing():
            raise AFDProtocolError(
                f"AFD attention rank {self._role_rank}: a step of {len(stage_tokens)} stages "
                "began on a stream that captures a CUDA graph; two-stage steps run eagerly"
            )
        first = self._announce(tuple(stage_tokens), flags, capturing=False, replay=False)
        self._active = first
        return tuple(replace(first, stage_index=s) for s in range(first.num_stages))

    def graph_capture(self) -> AbstractContextManager[None]:
        """The connector's context for CUDA graph captures (``AttentionEndpoint.graph_capture``)."""
        return self._connector.attention.graph_capture()

    def replay_step(self, num_tokens: int, replay: Callable[[], T]) -> T:
        """Announce a CUDA graph replay of ``num_tokens`` tokens, run ``replay()``, watch it.

        ``replay`` queues the replay of a graph whose capture step exchanged every layer;
        its result is returned. The connector then bounds the replay
        (``AttentionEndpoint.watch_graph_replay``). Needs no forward context.
        """
        metadata = self._announce((num_tokens,), SCHEDULED, capturing=False, replay=True)
        self._active = None
        self.completed_steps += 1
        result = replay()
        self._connector.attention.watch_graph_replay(metadata.step_id)
        return result

    def _announce(
        self, stage_tokens: tuple[int, ...], flags: StepFlags, *, capturing: bool, replay: bool
    ) -> AFDStepMetadata:
        """Number the next step and begin it on the endpoint (see :meth:`begin_step`);
        returns the metadata of its stage 0."""
        step_id = self._next_step_id
        metadata = AFDStepMetadata(step_id=step_id, padded_lens=stage_tokens)
        payload = ControlPayload(
            step_id=step_id,
            sender_rank=self._role_rank,
            stages=tuple(
                AFDDPMetadata(first_rank=self._role_rank, num_tokens=(tokens,))
                for tokens in stage_tokens
            ),
            is_warmup=flags.is_warmup or (flags.is_graph_capturing and not capturing),
            is_graph_capturing=capturing,
            is_profile=flags.is_profile,
            is_graph_step=capturing or replay,
        )
        self._next_step_id += 1
        self._stages_done = 0
        with afd_range(ATTENTION_BEGIN):
            self._connector.attention.begin_step(payload)
        return metadata

    def exchange(
        self,
        hidden: Any,
        router_logits: Any | None,
        layer: int,
        routing: ExpertRouting | None = None,
    ) -> Any:
        """Send ``hidden`` (and ``router_logits`` or ``routing``) of ``layer``; return FFN's output.

        Begins the step lazily when the forward has no step metadata yet. Returns a fresh
        tensor shaped like ``hidden`` that the caller owns. Raises AFDProtocolError for a
        token count that differs from the step's, or step metadata of another forward; the
        endpoint checks the layer order and shapes; connector errors propagate.
        """
        metadata = self._step_slot().get(METADATA_KEY)
        if metadata is None:
            flags = WARMUP if self._dummy_flags is None else self._dummy_flags
            metadata = self.begin_step(hidden.shape[0], flags)
        self._check_step(metadata)
        stage = metadata.stage_index
        if hidden.shape[0] != metadata.padded_lens[stage]:
            raise AFDProtocolError(
                f"AFD attention rank {self._role_rank}: layer {layer} of step "
                f"{metadata.step_id} has {hidden.shape[0]} tokens where the step announced "
                f"{metadata.padded_lens[stage]}; the model and the runner disagree about the "
                "forward"
            )
        logits = router_logits if self._wire.logits_width_at(layer) else None
        endpoint = self._connector.attention
        sent_at = time.perf_counter()
        with afd_range(ATTENTION_SEND, layer):
            endpoint.send(layer, stage, hidden.contiguous(), router_logits=logits, routing=routing)
        self._after_send()
        waiting_since = time.perf_counter()
        with afd_range(ATTENTION_WAIT, layer):
            out = endpoint.recv(layer, stage)
        received_at = time.perf_counter()
        self.exchange_wait_s += received_at - waiting_since
        self.exchange_seconds.observe(received_at - sent_at)
        out = self._share_output(out)
        if layer == self._layers[-1]:  # the endpoint took every layer before it, in order
            self._stages_done += 1
            if self._stages_done == metadata.num_stages:
                self.completed_steps += 1
                self.two_stage_steps += metadata.num_stages == 2
        return out

    def exchange_experts(self, hidden: Any, topk_weights: Any, topk_ids: Any, layer: int) -> Any:
        """:meth:`exchange` of a MoE layer of an expert-routed deployment (its routing)."""
        return self.exchange(hidden, None, layer, ExpertRouting(topk_ids, topk_weights))

    def _check_step(self, metadata: AFDStepMetadata) -> None:
        active = self._active
        if active is None or active.step_id != metadata.step_id:
            current = "none" if active is None else str(active.step_id)
            raise AFDProtocolError(
                f"AFD attention rank {self._role_rank}: the forward carries step "
                f"{metadata.step_id}, but the step begun last is {current}; the forward "
                "reused the step metadata of another forward"
            )
