"""The AFD side of one attention worker: its connector and step driver, opened and closed.

Shared by every attention worker (CPU and CUDA): a worker calls :func:`open_session`
right after its model is loaded and the session's ``close`` when it shuts down. With
attention tensor parallelism only TP rank 0 opens an :class:`AttentionSession` (the
connector, and a step driver that broadcasts each result over the TP group); the other
TP ranks open a :class:`TPFollowerSession` (:mod:`afd_attention.tensor_parallel`). When
the connector's peer watch finds an FFN rank gone (crashed, killed, silent, or stopped),
the session ends the worker process (:func:`afd_core.workers.process_exit.exit_worker_process`):
an attention rank cannot serve without its FFN ranks, and vLLM stops the deployment
(every TP rank with it) when a worker exits.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from afd_attention.step_driver import StepDriver
from afd_attention.tensor_parallel import TP_LEADER, TPFollower, tp_broadcast
from afd_attention.two_stages import TwoStageForward
from afd_core.connector import Connector
from afd_core.errors import AFDPeerError
from afd_core.workers.process_exit import exit_worker_process
from afd_core.workers.setup import role_worker_setup

# A child of vLLM's logger, so vLLM's logging config (handler, level, format) applies.
logger = logging.getLogger(f"vllm.{__name__}")

#: The stage threads wait this many AFD timeouts (``afd_process_group_timeout_s``).
STAGE_TIMEOUT_FACTOR = 2


class AttentionSession:
    """The connector and step driver of one attention worker, installed in the model."""

    def __init__(
        self,
        connector: Connector,
        driver: StepDriver,
        stages: TwoStageForward | None = None,
        rendezvous_s: float = 0.0,
    ) -> None:
        self.connector = connector
        self.driver = driver
        self.stages = stages
        #: Seconds the rendezvous with the FFN role took (the connector's ``initialize``).
        self.rendezvous_s = rendezvous_s

    @property
    def role_rank(self) -> int:
        """This worker's attention rank."""
        return self.connector.role_rank

    def stats(self) -> dict[str, Any]:
        """``afd_stats``: the steps done, of them those of two stages, the seconds waited
        for FFN results (:attr:`StepDriver.exchange_wait_s`), the histogram of layer
        exchange times (:attr:`StepDriver.exchange_seconds`), the rendezvous's seconds
        and the endpoint's counters."""
        return {
            "rendezvous_s": self.rendezvous_s,
            "steps": self.driver.completed_steps,
            "two_stage_steps": self.driver.two_stage_steps,
            "exchange_wait_s": self.driver.exchange_wait_s,
            "exchange_seconds": self.driver.exchange_seconds.as_dict(),
            "endpoint": self.connector.attention.stats(),
        }

    @classmethod
    def open(
        cls, vllm_config: Any, runner: Any, tp_rank: int, tp_size: int = 1
    ) -> AttentionSession:
        """Rendezvous with FFN and route the model's exchanges through a new step driver.

        ``runner`` is the worker's model runner (an
        :class:`~afd_attention.runner.AttentionRunnerMixin`) with its model loaded; with
        ``tp_size`` > 1 this is the TP leader, whose step driver broadcasts every result
        to the other TP ranks.
        Blocks until the FFN ranks are there, at most ``afd_process_group_timeout_s``.
        Raises AFDConfigError for a missing config, a model that is not an AFD wrapper or
        an unsupported layout (:func:`~afd_core.workers.setup.role_worker_setup`);
        connector errors (AFDPeerError, AFDProtocolError) propagate.
        """
        from afd_models.exchange_op import set_exchanger

        model = runner.get_model()
        setup = role_worker_setup(vllm_config, model, "attention", tp_rank)
        config, role_rank, wire = setup.config, setup.role_rank, setup.wire
        connector = setup.new_connector()
        connector.on_peer_lost = _end_worker
        logger.info(
            "AFD attention rank %d: waiting for FFN at %s:%d (%s, at most %d s)",
            role_rank,
            config.host,
            config.port,
            config.connector,
            config.afd_process_group_timeout_s,
        )
        stages = None
        if config.num_stages == 2:
            # Longer than the connector's own waits: its error comes first.
            timeout_s = STAGE_TIMEOUT_FACTOR * config.afd_process_group_timeout_s
            stages = TwoStageForward(
                config.stage_policy, timeout_s=timeout_s, streams=config.stage_streams
            )
        try:
            started = time.monotonic()
            connector.initialize()
            rendezvous_s = time.monotonic() - started
            driver = StepDriver(
                connector,
                wire,
                role_rank,
                exchange_layers=model.afd_exchange_layers(),
                after_send=(lambda: None) if stages is None else stages.checkpoint,
                share_output=tp_broadcast if tp_size > 1 else (lambda out: out),
            )
        except BaseException:
            connector.close()
            if stages is not None:
                stages.close()
            raise
        runner.afd_driver = driver
        runner.afd_stages = stages
        set_exchanger(driver)
        logger.info(
            "AFD attention rank %d: connected; %d exchange layers per step, hidden %d %s",
            role_rank,
            wire.num_exchange_layers,
            wire.hidden_size,
            wire.dtype,
        )
        return cls(connector, driver, stages, rendezvous_s)

    def close(self) -> None:
        """Stop routing exchanges here, close the connector (waking any blocked exchange),
        then stop the stage threads, if any (idempotent)."""
        from afd_models.exchange_op import set_exchanger

        set_exchanger(None)
        self.connector.on_peer_lost = None
        self.connector.close()
        if self.stages is not None:
            self.stages.close()


class TPFollowerSession:
    """A TP rank other than the leader: no connector; the model's exchanges take the
    leader's broadcast results (:class:`~afd_attention.tensor_parallel.TPFollower`)."""

    def __init__(self, follower: TPFollower, role_rank: int, tp_rank: int) -> None:
        self.follower = follower
        self.role_rank = role_rank
        self.tp_rank = tp_rank

    @classmethod
    def open(cls, vllm_config: Any, runner: Any, tp_rank: int) -> TPFollowerSession:
        """Install a :class:`TPFollower` as ``runner``'s driver and the model's exchanger.

        Raises AFDConfigError as :meth:`AttentionSession.open` does for a missing config
        or a model that is not an AFD wrapper; opens nothing.
        """
        from afd_models.exchange_op import set_exchanger

        setup = role_worker_setup(vllm_config, runner.get_model(), "attention", tp_rank)
        follower = TPFollower()
        runner.afd_driver = follower
        runner.afd_stages = None
        set_exchanger(follower)
        logger.info(
            "AFD attention rank %d, TP rank %d: takes each layer's FFN result from TP rank "
            "%d's broadcast",
            setup.role_rank,
            tp_rank,
            TP_LEADER,
        )
        return cls(follower, setup.role_rank, tp_rank)

    def stats(self) -> dict[str, Any]:
        """``afd_stats``: this TP rank and the exchanges it took from the leader."""
        return {"tensor_parallel_rank": self.tp_rank, "exchanges": self.follower.exchanges}

    def close(self) -> None:
        """Stop routing exchanges here (idempotent)."""
        from afd_models.exchange_op import set_exchanger

        set_exchanger(None)


def open_session(
    vllm_config: Any, runner: Any, tp_rank: int, tp_size: int
) -> AttentionSession | TPFollowerSession:
    """The session of TP rank ``tp_rank`` of ``tp_size``: the leader's
    :class:`AttentionSession`, or a :class:`TPFollowerSession` (see the module docstring)."""
    if tp_rank == TP_LEADER:
        return AttentionSession.open(vllm_config, runner, tp_rank, tp_size)
    return TPFollowerSession.open(vllm_config, runner, tp_rank)


def _end_worker(error: AFDPeerError) -> None:
    exit_worker_process("attention", error)
