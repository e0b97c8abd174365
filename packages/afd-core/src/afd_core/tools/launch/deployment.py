"""A local AFD deployment: F FFN servers and A attention servers of one model.

Each attention rank is its own vLLM server (data-parallel size 1) with ``role_rank`` set
to its rank; so is each FFN rank. Both roles start concurrently: each blocks in the
connector's rendezvous until its peers exist, so the order (``ffn_first``) only says who
starts first and ``stagger_s`` how long the other waits. Clients talk to the attention
servers (:attr:`LocalDeployment.endpoints`); every server runs with
``VLLM_SERVER_DEV_MODE=1`` so its AFD counters are readable through ``/collective_rpc``
(``afd_stats``).
"""

from __future__ import annotations

import random
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from afd_core.config import parse_afd_config
from afd_core.runtime.store_gate import SECRET_ENV
from afd_core.tools.launch.server import (
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_STOP_GRACE_S,
    ServerError,
    ServerSpec,
    VllmServer,
)
from afd_core.topology import Role

DEFAULT_CONNECTOR = "P2pGlooAFDConnector"
DEFAULT_START_TIMEOUT_S = 180.0
_PROGRESS_EVERY_S = 15.0


#: Every AFD server answers ``GET /afd/status`` (:mod:`afd_core.http_status`).
STATUS_ARGS = ("--middleware", "afd_core.http_status.AFDStatusMiddleware")


@dataclass(frozen=True)
class DeploymentSpec:
    """What to launch.

    ``attention_port``: API port of attention server 0 (server ``a`` gets
    ``attention_port + a``); None picks free ports, as for the FFN servers and the
    connector's rendezvous port (``connector_port``). ``extra_args`` go to every server's
    vLLM command line and ``extra_env`` into every server's environment (last, so it wins;
    e.g. ``VLLM_USE_V2_MODEL_RUNNER``); ``role_env[role]`` goes on top of it for the
    servers of that role only (e.g. ``CUDA_VISIBLE_DEVICES`` to put each role on its own
    GPU), and ``role_args[role]`` after ``extra_args`` on their command lines (e.g.
    ``("--tensor-parallel-size", "2")`` for the attention role); ``role_cpus[role]``
    confines each server of that role to those CPUs (:attr:`ServerSpec.cpus`; e.g.
    ``{"attention": (0,), "ffn": (1,)}`` for a role per core); ``rank_gpus[role]`` names
    the GPU of each server of that role by role rank (its ``CUDA_VISIBLE_DEVICES``, over
    ``role_env``; e.g. ``{"attention": ("0", "1"), "ffn": ("2",)}`` for 2A1F on three
    GPUs), one entry per rank. ``max_num_seqs`` goes
    to every server (vLLM's ``--max-num-seqs``: the most requests a step batches).
    ``num_stages``, ``stage_decode_token_threshold``,
    ``stage_prefill_token_threshold``, ``stage_streams``, ``afd_process_group_timeout_s``
    and ``connector_extra_config``, ``async_dp``: the AFD config keys of those names, on every
    server (None / empty / false: their defaults). ``rendezvous_secret`` goes into every
    server's environment as ``AFD_RENDEZVOUS_SECRET`` (:mod:`afd_core.runtime.store_gate`):
    by default a new random one per spec, so no process outside the deployment can use its
    rendezvous store; ``""`` launches without one. It is left out of the repr.
    """

    model: Path
    num_attention_ranks: int = 1
    num_ffn_ranks: int = 1
    connector: str = DEFAULT_CONNECTOR
    compute_gate_on_attention: bool = False
    enforce_eager: bool = True
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    ffn_first: bool = True
    stagger_s: float = 0.0
    host: str = "127.0.0.1"
    attention_port: int | None = None
    connector_port: int | None = None
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    role_env: Mapping[Role, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    role_args: Mapping[Role, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    role_cpus: Mapping[Role, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    rank_gpus: Mapping[Role, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    num_stages: int = 1
    stage_decode_token_threshold: int | None = None
    stage_prefill_token_threshold: int | None = None
    stage_streams: str | None = None
    afd_process_group_timeout_s: int | None = None
    connector_extra_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    async_dp: bool = False
    rendezvous_secret: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)

    def afd_settings(self, role: Role, role_rank: int, connector_port: int) -> dict[str, Any]:
        """The ``additional_config["afd"]`` of rank ``role_rank`` of ``role``."""
        settings: dict[str, Any] = {
            "role": role,
            "connector": self.connector,
            "host": self.host,
            "port": connector_port,
            "num_attention_ranks": self.num_attention_ranks,
            "num_ffn_ranks": self.num_ffn_ranks,
            "role_rank": role_rank,
            "compute_gate_on_attention": self.compute_gate_on_attention,
            "num_stages": self.num_stages,
        }
        if self.async_dp:
            settings["async_dp"] = True
        optional = {
            "stage_decode_token_threshold": self.stage_decode_token_threshold,
            "stage_prefill_token_threshold": self.stage_prefill_token_threshold,
            "stage_streams": self.stage_streams,
            "afd_process_group_timeout_s": self.afd_process_group_timeout_s,
        }
        settings.update({key: value for key, value in optional.items() if value is not None})
        if self.connector_extra_config:
            settings["connector_extra_config"] = dict(self.connector_extra_config)
        return settings

    def server_specs(
        self, connector_port: int, attention_ports: list[int], ffn_ports: list[int]
    ) -> list[ServerSpec]:
        """Every server of the deployment, FFN ranks first; validates each AFD config.

        Raises AFDConfigError (or AFDInstallError for a connector that cannot load)
        before anything starts.
        """
        ports = {"ffn": ffn_ports, "attention": attention_ports}
        secret_env = {SECRET_ENV: self.rendezvous_secret} if self.rendezvous_secret else {}
        for role, gpus in self.rank_gpus.items():
            if len(gpus) != len(ports[role]):
                raise ValueError(
                    f"DeploymentSpec.rank_gpus[{role!r}] names {len(gpus)} GPU(s) for "
                    f"{len(ports[role])} {role} server(s); give one per rank"
                )
        specs = []
        for role in ("ffn", "attention"):
            for rank in range(len(ports[role])):
                gpus = self.rank_gpus.get(role)
                gpu_env = {} if gpus is None else {"CUDA_VISIBLE_DEVICES": gpus[rank]}
                settings = self.afd_settings(role, rank, connector_port)
                parse_afd_config(settings)
                specs.append(
                    ServerSpec(
                        name=f"{role}-{rank}",
                        model=self.model,
                        port=ports[role][rank],
                        host=self.host,
                        served_model_name=self.served_model_name,
                        enforce_eager=self.enforce_eager,
                        max_num_seqs=self.max_num_seqs,
                        additional_config={"afd": settings},
                        dev_mode=True,
                        extra_args=(
                            *STATUS_ARGS,
                            *self.extra_args,
                            *self.role_args.get(role, ()),
                        ),
                        extra_env={
                            **secret_env,
                            **self.extra_env,
                            **self.role_env.get(role, {}),
                            **gpu_env,
                        },
                        cpus=tuple(self.role_cpus.get(role, ())),
                    )
                )
        return specs


class LocalDeployment:
    """Runs a :class:`DeploymentSpec` on this machine; see the module docstring.

    ``work_dir`` (default: a new temporary directory, kept for its logs) receives one log
    per server; ``cache_root`` (default ``work_dir/vllm-cache``) is shared by all
    servers. ``progress`` receives one line per event (default: print). Use as a context
    manager: ``with LocalDeployment(spec) as d: ... d.endpoint ...``.
    """

    def __init__(
        self,
        spec: DeploymentSpec,
        work_dir: Path | None = None,
        cache_root: Path | None = None,
        progress: Callable[[str], None] = print,
    ) -> None:
        self.spec = spec
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="afd-launch-"))
        self.cache_root = cache_root
        self.progress = progress
        self.servers: list[VllmServer] = []

    @property
    def attention_servers(self) -> list[VllmServer]:
        """The attention servers, by rank."""
        return [s for s in self.servers if s.spec.name.startswith("attention-")]

    @property
    def ffn_servers(self) -> list[VllmServer]:
        """The FFN servers, by rank."""
        return [s for s in self.servers if s.spec.name.startswith("ffn-")]

    @property
    def endpoints(self) -> list[str]:
        """Base URLs of the attention servers (where requests go), by rank."""
        return [s.url for s in self.attention_servers]

    @property
    def endpoint(self) -> str:
        """Base URL of attention server 0."""
        if not self.servers:
            raise ServerError("AFD deployment: not started; call start() first")
        return self.endpoints[0]

    @property
    def model_name(self) -> str:
        """The model name clients send."""
        return self.attention_servers[0].spec.model_name

    def start(self) -> float:
        """Start every server and wait until all are healthy; return the seconds taken.

        On any failure (invalid config, a server exiting, the deadline of
        ``spec.start_timeout_s`` passing, Ctrl-C) everything started so far is stopped
        and the error propagates.
        """
        if self.servers:
            raise ServerError("AFD deployment: already started")
        spec = self.spec
        begin = time.monotonic()
        deadline = begin + spec.start_timeout_s
        connector_port, *ports = free_ports(1 + spec.num_attention_ranks + spec.num_ffn_ranks)
        if spec.connector_port is not None:
            connector_port = spec.connector_port
        ffn_ports = ports[: spec.num_ffn_ranks]
        attention_ports = ports[spec.num_ffn_ranks :]
        if spec.attention_port is not None:
            attention_ports = [spec.attention_port + a for a in range(spec.num_attention_ranks)]
        specs = spec.server_specs(connector_port, attention_ports, ffn_ports)
        self.servers = [VllmServer(s, self.work_dir, self.cache_root) for s in specs]
        first, second = (
            (self.ffn_servers, self.attention_servers)
            if spec.ffn_first
            else (self.attention_servers, self.ffn_servers)
        )
        self.progress(
            f"AFD deployment of {spec.model}: {spec.num_attention_ranks} attention + "
            f"{spec.num_ffn_ranks} FFN server(s), connector {spec.connector} on port "
            f"{connector_port}, logs in {self.work_dir}"
        )
        try:
            self._start_all(first)
            stagger_end = time.monotonic() + spec.stagger_s
            while time.monotonic() < stagger_end:
                for server in first:
                    server.check_alive()
                time.sleep(0.2)
            self._start_all(second)
            self._wait_all_healthy(deadline)
        except BaseException:
            self.stop()
            raise
        took = time.monotonic() - begin
        self.progress(f"AFD deployment ready in {took:.1f} s; endpoint {self.endpoint}")
        return took

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> list[int]:
        """Stop every server (all at once, any order); return leftover pids (normally none).

        Idempotent. SIGTERM goes to every server first, so no server waits for a peer that
        is already gone.
        """
        for server in self.servers:
            server.terminate()
        for server in self.servers:
            server.stop(grace_s)
        return sorted(pid for s in self.servers for pid in s.leftover_pids())

    def ffn_stats(self) -> list[dict[str, Any]]:
        """``afd_stats`` of every FFN server's workers, FFN rank order (one dict each)."""
        return [stats for s in self.ffn_servers for stats in s.collective_rpc("afd_stats")]

    def attention_stats(self) -> list[dict[str, Any]]:
        """``afd_stats`` of every attention server's workers, rank order (one dict each)."""
        return [stats for s in self.attention_servers for stats in s.collective_rpc("afd_stats")]

    def __enter__(self) -> LocalDeployment:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _start_all(self, servers: list[VllmServer]) -> None:
        for server in servers:
            server.start()
            self.progress(
                f"  started {server.spec.name} (pid {server.pid}) on {server.url}, "
                f"log {server.log_path}"
            )

    def _wait_all_healthy(self, deadline: float) -> None:
        pending = list(self.servers)
        next_report = time.monotonic() + _PROGRESS_EVERY_S
        while pending:
            for server in list(pending):
                if server.is_healthy():
                    pending.remove(server)
                    self.progress(
                        f"  {server.spec.name} healthy after {server.seconds_since_start():.1f} s"
                    )
            now = time.monotonic()
            if pending and now > deadline:
                late = pending[0]
                raise ServerError(
                    f"AFD deployment: {', '.join(s.spec.name for s in pending)} not healthy "
                    f"{self.spec.start_timeout_s:.0f} s after start; {late.log_digest()}"
                )
            if pending and now > next_report:
                waiting = ", ".join(
                    f"{s.spec.name} ({s.seconds_since_start():.0f} s)" for s in pending
                )
                self.progress(f"  waiting for {waiting}")
                next_report = now + _PROGRESS_EVERY_S
            if pending:
                time.sleep(0.5)


#: Where :func:`free_ports` looks first: below Linux's default ephemeral range.
_QUIET_PORTS = range(20000, 32768)
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _quiet_ports() -> range:
    """Ports the OS does not hand out for outgoing connections (empty if unknown).

    A port taken from the ephemeral range can be grabbed by any process's next outgoing
    connection (an HTTP health probe, a ZMQ socket) in the seconds before the server that
    was given it binds; vLLM servers bind their connector port only after loading the
    model, so that window is long.
    """
    try:
        low, _high = (int(v) for v in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return range(0)
    if low <= _QUIET_PORTS.start:
        return range(0)
    return range(_QUIET_PORTS.start, min(_QUIET_PORTS.stop, low))


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that are free on ``host`` right now.

    Prefers ports below the OS's ephemeral range (see :func:`_quiet_ports`), picked at
    random so concurrent callers rarely pick the same one; falls back to ports the OS
    picks when that range is unknown or has no free port.
    """
    candidates = list(_quiet_ports())
    random.shuffle(candidates)
    with ExitStack() as stack:
        ports: list[int] = []
        for port in candidates:
            if len(ports) == count:
                break
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind((host, port))
            except OSError:
                continue
            ports.append(port)
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports
