"""The FFN role's server: the life cycle of one FFN rank on a daemon thread.

An FFN rank has no scheduler and no KV cache. Its :class:`FFNServer` thread
(``afd-ffn-server``) does the rendezvous, then serves the connector with one of two
loops until the connector ends:

* :class:`~afd_ffn.loops.step_loop.StepLoop` for a connector that announces steps (the
  layer-major step loop; CUDA graph steps in :mod:`afd_ffn.loops.graph_steps`);
* :class:`~afd_ffn.loops.work_lanes.WorkLanes` for a connector without a control plane
  (:class:`~afd_core.connector.FFNWorkEndpoint`): a thread per lane, each item through
  :class:`~afd_ffn.loops.work_lanes.WorkItemServer`.

Both compute through one :class:`~afd_ffn.loops.compute.LayerCompute` (the move to the compute
device, the batch context, the compute range). Each step runs inside the compute context
(vLLM: ``torch.inference_mode()``, ``set_forward_context(None, vllm_config)`` and, on
CUDA, the worker's device as the thread's current device; the MoE layers find themselves
through the forward context). The result goes back as is, and the connector copies it
into its own buffers. What stays here is the life cycle: rendezvous, a new rendezvous
after the attention ranks left, failure.

vLLM's forward context is a module global, not a thread-local: setting it from this
thread is safe because the FFN worker's main thread never runs a forward (it only answers
vLLM's RPCs, and the FFN worker refuses ``execute_model``).

When an attention rank leaves or is lost, a connector that replaces attention ranks
(``Connector.replaces_attention_ranks``: the gloo connectors, see
:mod:`afd_core.runtime.links`) lets that rank's link go by itself, keeps serving the others
and takes in the server that replaces it; it fails only when no attention rank was
linked for ``ffn_idle_limit_s``. With any other connector the attention ranks' leaving
ends the loop (an ``AFDPeerError`` while serving: a goodbye, a closed or silent heartbeat
link, a transfer whose peer is gone), and the FFN rank keeps its model and waits at a new
rendezvous (same config, a fresh connector from ``reconnect``) for their replacements,
for up to ``ffn_idle_limit_s`` (checked between rendezvous attempts, each bounded by
``afd_process_group_timeout_s``). The connector's peer watch reports a peer that is gone
(or left) within seconds even while the loop idles.

Any other error, a first rendezvous that fails, or an idle limit that passes ends the
loop for good: it is logged with its reason, kept for ``check_health``, the connector is
closed (so the peers see the FFN rank go instead of waiting for it) and ``on_failure``
runs; in a vLLM worker that ends the process
(:func:`afd_core.workers.process_exit.exit_worker_process`), so vLLM shuts the FFN deployment
down and its API server exits with status 1.

Platform independent: vLLM and torch are imported only by :func:`vllm_compute_context`
and :func:`open_ffn_server`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from afd_core.connector import Connector
from afd_core.errors import AFDConfigError, AFDPeerError, AFDProtocolError, AFDShutdown
from afd_core.kit.peer_links import loss_record
from afd_core.workers.process_exit import exit_worker_process
from afd_core.workers.setup import role_worker_setup
from afd_ffn.loops.compute import LayerCompute
from afd_ffn.loops.graph_steps import FFNStepGraphs
from afd_ffn.loops.step_loop import StepLoop
from afd_ffn.loops.work_lanes import WorkItemServer, WorkLanes
from afd_ffn.stats import FFNStats
from afd_models.roles import FFNModel

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: Name of the server thread (visible in ``py-spy dump`` and thread listings).
THREAD_NAME = "afd-ffn-server"


def describe_failure(exc: BaseException) -> str:
    """A short reason for a loop failure, for the log line."""
    if isinstance(exc, AFDPeerError):
        return "an attention rank did not arrive, is gone, or stopped answering"
    if isinstance(exc, AFDProtocolError):
        return "the attention role sent something this FFN rank did not expect"
    return f"{type(exc).__name__} while serving"


def no_batch_context(rows: int) -> AbstractContextManager[Any]:
    """The default context of a received batch: nothing (the step's context is enough)."""
    return nullcontext()


class FFNServer:
    """Serves one FFN rank: rendezvous, then the step loop, on a daemon thread.

    ``connector`` must not be initialised yet (the thread does it, bounded by the AFD
    timeout). ``compute_context`` returns the context each step runs in;
    ``batch_context(rows)`` the context of each received batch inside it (a platform
    whose MoE communication depends on the batch's size, such as vllm-ascend's, sets its
    forward context there; default: nothing);
    ``on_failure`` is called on the server thread after a failure was recorded and the
    connector closed. ``device`` (a ``torch.device``, or None to leave tensors where the
    connector put them) is where the model computes: received tensors are moved there.
    On a CUDA ``device`` graph steps are served by :class:`~afd_ffn.loops.graph_steps.FFNStepGraphs`
    with at most ``max_cuda_graphs`` captured graphs; elsewhere a graph step is an error.
    ``reconnect`` builds a fresh, uninitialised connector of the same config for a new
    rendezvous after the attention ranks left; with None (or ``idle_limit_s`` 0) their
    leaving is a failure. ``on_step`` runs on the server thread after every step served
    (the worker's profiler counts its iterations there). The loop is annotated with the
    ranges of :mod:`afd_core.workers.profiling` while a profile runs.
    """

    def __init__(
        self,
        connector: Connector,
        model: FFNModel,
        *,
        compute_context: Callable[[], AbstractContextManager[Any]],
        batch_context: Callable[[int], AbstractContextManager[Any]] = no_batch_context,
        on_failure: Callable[[BaseException], None],
        device: Any | None = None,
        max_cuda_graphs: int = 0,
        reconnect: Callable[[], Connector] | None = None,
        idle_limit_s: float = 0.0,
        on_step: Callable[[], None] = lambda: None,
    ) -> None:
        layers = tuple(model.afd_exchange_layers())
        if len(layers) != connector.wire.num_exchange_layers:
            raise AFDConfigError(
                f"AFD FFN: the model exchanges {len(layers)} layers {layers} but its wire spec "
                f"announces {connector.wire.num_exchange_layers}; fix the model wrapper"
            )
        self._connector = connector
        self._model = model
        self._layers = layers
        self._compute_context = compute_context
        self._on_failure = on_failure
        self._device = device
        self._max_cuda_graphs = max_cuda_graphs
        self._on_step = on_step
        self._reconnect = reconnect if idle_limit_s > 0 else None
        self._idle_limit_s = idle_limit_s
        self._stopping = threading.Event()
        self._fail_lock = threading.Lock()
        self._connector_lock = threading.Lock()
        self._lost: AFDPeerError | None = None
        #: True from a completed rendezvous until its attention ranks leave or fail.
        self._serving = False
        #: The last loss of attention ranks this server lived through, and when (time.time).
        self._last_loss: tuple[str, float] | None = None
        self._thread: threading.Thread | None = None
        self.stats = FFNStats()
        self.error: BaseException | None = None
        self._compute = LayerCompute(model, self.stats, device=device, batch_context=batch_context)

    def _loop_for(self, connector: Connector) -> StepLoop | WorkLanes:
        """The loop that serves the initialised ``connector``."""
        if connector.serves_work_items:
            endpoint = connector.ffn_work
            serve = WorkItemServer(
                endpoint,
                self._compute,
                compute_context=self._compute_context,
                stats=self.stats,
                on_item=self._on_step,
            )
            return WorkLanes(endpoint, serve, connector.close)
        graphs = None
        if getattr(self._device, "type", None) == "cuda":
            graphs = FFNStepGraphs(
                connector,
                self._model,
                self._layers,
                device=self._device,
                max_graphs=self._max_cuda_graphs,
                stats=self.stats,
            )
        return StepLoop(
            connector.ffn,
            self._layers,
            self._compute,
            compute_context=self._compute_context,
            graphs=graphs,
            stats=self.stats,
            on_step=self._on_step,
        )

    @property
    def model(self) -> FFNModel:
        """The FFN model this server computes with."""
        return self._model

    @property
    def role_rank(self) -> int:
        """This FFN rank."""
        return self._connector.role_rank

    def endpoint_stats(self) -> dict[str, Any]:
        """The connector endpoint's counters ({} until the rendezvous is done)."""
        return self._connector.endpoint_stats()

    def status(self) -> dict[str, Any]:
        """The FFN rank's readiness, as ``afd_status`` reports it (plain JSON values).

        ``ready`` is true while the server serves: its rendezvous is done, it has not
        failed, and at least one attention rank is linked where the endpoint counts
        links. ``state`` is ``"waiting for attention ranks"`` (before a rendezvous is
        done, or at a new one after its attention ranks left), ``"serving"``,
        ``"failed"`` or ``"stopped"``; ``rendezvous`` counts the rendezvous completed;
        ``linked_attention_ranks``, ``attention_replacements`` and ``expert_block`` come
        from the endpoint where it has them; ``last_peer_loss`` is the last loss of
        attention ranks lived through (``{"error", "unix_time"}``: of a whole rendezvous,
        else the endpoint's last link let go) or None; ``error`` the
        failure that stopped the server, or None.
        """
        endpoint = self.endpoint_stats() if self._serving else {}
        linked = endpoint.get("linked_attention_ranks")
        if self.error is not None:
            state = "failed"
        elif self._stopping.is_set():
            state = "stopped"
        else:
            state = "serving" if self._serving else "waiting for attention ranks"
        error = self.error
        return {
            "role": "ffn",
            "ffn_rank": self.role_rank,
            "ready": state == "serving" and (linked is None or len(linked) > 0),
            "state": state,
            "rendezvous": self.stats.rendezvous,
            "linked_attention_ranks": linked,
            "attention_replacements": endpoint.get("attention_replacements"),
            "expert_block": endpoint.get("expert_block"),
            "last_peer_loss": loss_record(self._last_loss) or endpoint.get("last_peer_loss"),
            "error": None if error is None else f"{describe_failure(error)}: {error}",
        }

    @property
    def is_running(self) -> bool:
        """True while the server thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the server thread (once)."""
        if self._thread is not None:
            raise RuntimeError("FFNServer.start() was already called")
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Close the connector (waking the thread) and join it; True if it ended in time."""
        self._stopping.set()
        with self._connector_lock:
            connector = self._connector
        connector.close()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._connector.on_peer_lost = functools.partial(self._peer_lost, self._connector)
            started = time.monotonic()
            self._connector.initialize()
            self.stats.rendezvous += 1
            self.stats.rendezvous_s += time.monotonic() - started
            self._serving = True
            while (lost := self._serve_until_ended()) is not None:
                self._rendezvous_again(lost)
        except AFDShutdown:
            pass
        except Exception as exc:
            self._fail(exc)
            return
        if self.error is None:
            logger.info(
                "AFD FFN rank %d: stopped after %d steps",
                self._connector.role_rank,
                self.stats.steps,
            )

    def _serve_until_ended(self) -> AFDPeerError | None:
        """Serve the connector's steps until it ends; the AFDPeerError of attention ranks
        that left or were lost, or None when it was closed (stop, end of the control plane).
        """
        connector = self._connector
        logger.info(
            "AFD FFN rank %d: serving %d exchange layers per step",
            connector.role_rank,
            len(self._layers),
        )
        try:
            self._loop_for(connector).run()
        except AFDShutdown:
            pass
        except AFDPeerError as exc:
            return exc
        return None if self._stopping.is_set() else self._lost

    def _peer_lost(self, connector: Connector, exc: AFDPeerError) -> None:
        """The peer watch of ``connector`` found a peer gone (its own thread)."""
        self._serving = False
        self._last_loss = (str(exc), time.time())
        if self._reconnect is None:
            self._fail(exc)
            return
        self._lost = exc
        connector.close()  # wakes the loop, which then opens a new rendezvous

    def _rendezvous_again(self, lost: AFDPeerError) -> None:
        """Replace the connector by one that completed a new rendezvous (bounded by the
        idle limit); raise ``lost`` when there is no ``reconnect``."""
        self._serving = False
        self._last_loss = (str(lost), time.time())
        if self._reconnect is None:
            raise lost
        rank = self._connector.role_rank
        self._connector.close()
        logger.warning(
            "AFD FFN rank %d: %s; this FFN rank keeps its model and waits up to %g s "
            "(ffn_idle_limit_s) for attention ranks at a new rendezvous",
            rank,
            lost,
            self._idle_limit_s,
        )
        deadline = time.monotonic() + self._idle_limit_s
        while True:
            connector = self._reconnect()
            with self._connector_lock:
                self._connector, self._lost = connector, None
            if self._stopping.is_set():
                connector.close()
                raise AFDShutdown("AFD FFN: stopped while waiting for attention ranks")
            connector.on_peer_lost = functools.partial(self._peer_lost, connector)
            started = time.monotonic()
            try:
                connector.initialize()
            except AFDPeerError as exc:  # nobody came within one rendezvous timeout
                connector.close()
                if time.monotonic() >= deadline:
                    raise AFDPeerError(
                        f"AFD FFN rank {rank}: no attention rank came within "
                        f"ffn_idle_limit_s={self._idle_limit_s:g} s after the last ones left "
                        f"({lost}); start the attention servers, or raise ffn_idle_limit_s"
                    ) from exc
                continue
            self.stats.rendezvous += 1
            self.stats.rendezvous_s += time.monotonic() - started
            self._serving = True
            logger.info("AFD FFN rank %d: new attention ranks joined", rank)
            return

    def _fail(self, exc: BaseException) -> None:
        """End serving for good because of ``exc`` (once; from the loop or the peer watch):
        record it, log it with its reason, close the connector, call ``on_failure``."""
        rank = self._connector.role_rank
        with self._fail_lock:
            if self._stopping.is_set():
                logger.debug("AFD FFN rank %d: error while stopping: %r", rank, exc)
                return
            if self.error is not None:
                return
            self.error = exc
            self._serving = False
        logger.error(
            "AFD FFN rank %d: the FFN server stopped after %d steps: %s: %s",
            rank,
            self.stats.steps,
            describe_failure(exc),
            exc,
            exc_info=exc if exc.__traceback__ is not None else None,
        )
        self._connector.close()
        self._on_failure(exc)


def vllm_compute_context(
    vllm_config: Any, device: Any | None = None
) -> Callable[[], AbstractContextManager[None]]:
    """The context an FFN step runs in: inference mode and a vLLM forward context.

    With a CUDA ``device`` it is also the current device of the thread that enters it
    (each thread has its own, and the server thread is not the one vLLM set up).
    """
    import torch
    from vllm.forward_context import set_forward_context

    on_cuda = device is not None and torch.device(device).type == "cuda"

    @contextmanager
    def context() -> Iterator[None]:
        with ExitStack() as stack:
            if on_cuda:
                stack.enter_context(torch.cuda.device(device))
            stack.enter_context(torch.inference_mode())
            stack.enter_context(set_forward_context(None, vllm_config))
            yield

    return context


def open_ffn_server(
    vllm_config: Any,
    model: Any,
    tp_rank: int,
    device: Any | None = None,
    on_step: Callable[[], None] = lambda: None,
    batch_context: Callable[[int], AbstractContextManager[Any]] = no_batch_context,
) -> FFNServer:
    """Build the FFN server of this vLLM worker and start it.

    Resolves the AFD config, the FFN rank and the model's wire spec
    (:func:`~afd_core.workers.setup.role_worker_setup`), builds the connector (the server
    thread does the rendezvous) and starts the thread. ``device`` is the
    worker's ``torch.device`` (where the model computes; see :class:`FFNServer`);
    ``on_step`` runs after every step served; ``batch_context`` as for :class:`FFNServer`.
    Raises
    AFDConfigError for a missing config, an unsupported layout or a model that is not an
    AFD wrapper.
    """
    setup = role_worker_setup(vllm_config, model, "ffn", tp_rank)
    config, role_rank = setup.config, setup.role_rank
    connector = setup.new_connector()
    server = FFNServer(
        connector,
        model,
        compute_context=vllm_compute_context(vllm_config, device),
        batch_context=batch_context,
        on_failure=functools.partial(exit_worker_process, "FFN"),
        device=device,
        max_cuda_graphs=config.ffn_cuda_graphs,
        # A connector that replaces attention ranks itself never needs a new rendezvous.
        reconnect=None if connector.replaces_attention_ranks else setup.new_connector,
        idle_limit_s=config.ffn_idle_limit_s,
        on_step=on_step,
    )
    server.start()
    logger.info(
        "AFD FFN rank %d: server thread started; waiting for %d attention rank(s) at %s:%d "
        "(%s, at most %d s)",
        role_rank,
        len(config.topology.block_of(role_rank)),
        config.host,
        config.port,
        config.connector,
        config.afd_process_group_timeout_s,
    )
    return server
