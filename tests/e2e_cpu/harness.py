"""Shared helpers of the CPU end-to-end tests: tiny models, servers, requests, leaks.

* :func:`build_tiny_models`: the generator's checkpoints of one family (``python -m
  afd_models.tiny``), or the prebuilt ones named by ``$AFD_TINY_MODELS`` / ``$AFD_WIDE_MODELS``.
* :class:`MonolithicServers`: plain vLLM servers (no AFD) per (model, eager), started on
  first use and reused until :meth:`MonolithicServers.stop_all`.
* :func:`complete`: greedy completions through the official ``openai`` client, with the
  token ids and the top-5 logprobs of every generated token;
  :func:`first_mismatch` compares two runs of them.
* :func:`post_json`: a JSON ``POST`` whose HTTP error status is an answer, not an error.
* :func:`leftover_processes`: processes of launched servers that are still alive.
* :func:`settled`: a reading (a deployment's counters) once it stops changing.

Every wait is bounded: server start by :data:`SERVER_START_TIMEOUT_S`, requests by
:data:`REQUEST_TIMEOUT_S`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from afd_core.tools.launch import ServerSpec, VllmServer, free_ports
from afd_core.tools.launch.processes import session_processes, started_sessions

SERVER_START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 120.0
TINY_MODEL_BUILD_TIMEOUT_S = 300.0
TOP_LOGPROBS = 5
#: Relative tolerance of at least two bf16 ulps (an ulp is 2**-8..2**-7 of a value), for
#: logprobs of runs whose step batches may differ.
BF16_RTOL = 2.0**-6
_TOKEN_ID_PREFIX = "token_id:"
SETTLE_INTERVAL_S = 0.5
SETTLE_TIMEOUT_S = 30.0

T = TypeVar("T")


def settled(
    read: Callable[[], T],
    interval_s: float = SETTLE_INTERVAL_S,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> T:
    """``read()`` once it stops changing: the first value equal to the one read
    ``interval_s`` before it.

    A deployment's counters move on after a completion has returned: vLLM's data-parallel
    engines end a wave with dummy steps that still cross every layer, and a server counts
    a step after its last reply. Raises AssertionError when the value still changes after
    ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last = read()
    while True:
        time.sleep(interval_s)
        now = read()
        if now == last:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"still changing after {timeout_s} s: {last} then {now}")
        last = now


def build_tiny_models(out_dir: Path, family: str = "tiny") -> Path:
    """The directory holding every model of the generator's ``family``
    (``<dir>/tiny-qwen3-moe``, ...; ``"wide"``: ``<dir>/wide-qwen3-moe``, ...).

    ``$AFD_TINY_MODELS`` (``$AFD_WIDE_MODELS`` for the wide family; built earlier by
    ``python -m afd_models.tiny DIR --family F``) wins; otherwise the models are built
    into ``out_dir`` in a child process.
    """
    prebuilt = os.environ.get(f"AFD_{family.upper()}_MODELS")
    if prebuilt:
        return Path(prebuilt)
    subprocess.run(
        [sys.executable, "-m", "afd_models.tiny", str(out_dir), "--family", family],
        check=True,
        timeout=TINY_MODEL_BUILD_TIMEOUT_S,
    )
    return out_dir


@dataclass(frozen=True)
class Completion:
    """One greedy completion.

    ``top_logprobs[i]`` maps token id to logprob for the best :data:`TOP_LOGPROBS`
    candidates at generated position ``i``.
    """

    token_ids: tuple[int, ...]
    top_logprobs: tuple[Mapping[int, float], ...]
    text: str

    @property
    def first_token_logprobs(self) -> Mapping[int, float]:
        """The top logprobs of the first generated token."""
        return self.top_logprobs[0]

    @property
    def min_top2_gap(self) -> float:
        """Smallest best-minus-second logprob over the generated positions (nats)."""
        gaps = []
        for candidates in self.top_logprobs:
            best, second = sorted(candidates.values(), reverse=True)[:2]
            gaps.append(best - second)
        return min(gaps)


def complete(
    endpoint: str,
    prompts: Sequence[str],
    max_tokens: int,
    model: str | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> list[Completion]:
    """Greedy completions of ``prompts`` in one request (one batch), in prompt order.

    ``endpoint`` is the server's base URL (``http://host:port``); ``model`` defaults to
    the first model the server lists. EOS is ignored, so every completion has
    ``max_tokens`` tokens.
    """
    import openai

    client = openai.OpenAI(
        base_url=f"{endpoint}/v1", api_key="unused", timeout=timeout_s, max_retries=0
    )
    with client:
        name = model or client.models.list().data[0].id
        response = client.completions.create(
            model=name,
            prompt=list(prompts),
            max_tokens=max_tokens,
            temperature=0.0,
            logprobs=TOP_LOGPROBS,
            extra_body={
                "ignore_eos": True,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            },
        )
    choices = sorted(response.choices, key=lambda c: c.index)
    return [_completion(choice) for choice in choices]


def first_mismatch(
    expected: Sequence[Completion],
    actual: Sequence[Completion],
    atol: float = 0.0,
    rtol: float = 0.0,
) -> str | None:
    """Where ``actual`` departs from ``expected``, or None when they agree.

    Token ids must be identical. At every position the sorted top logprob values must
    agree within ``atol + rtol * |value|``, and so must the logprob of every candidate
    clearly inside the top list (above its last value by more than that tolerance):
    candidates level with the last place are interchangeable. vLLM's logits are bf16, so
    any change in the batching of a step can move a logprob by an ulp or two (2**-8
    relative each); :data:`BF16_RTOL` allows for that.
    """
    if len(expected) != len(actual):
        return f"{len(expected)} completions expected, got {len(actual)}"
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want.token_ids != got.token_ids:
            return f"prompt {i}: tokens {want.token_ids} expected, got {got.token_ids}"
        for pos, (x, y) in enumerate(zip(want.top_logprobs, got.top_logprobs, strict=True)):
            problem = logprobs_mismatch(x, y, atol, rtol)
            if problem:
                return f"prompt {i}, generated token {pos}: {problem}: {dict(x)} vs {dict(y)}"
    return None


def logprobs_mismatch(
    x: Mapping[int, float], y: Mapping[int, float], atol: float, rtol: float
) -> str:
    """Why the top logprobs ``y`` of one position differ from ``x`` ("" when they agree;
    the rules of :func:`first_mismatch`)."""

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= atol + rtol * max(abs(a), abs(b))

    xs, ys = sorted(x.values(), reverse=True), sorted(y.values(), reverse=True)
    if len(xs) != len(ys) or not all(close(a, b) for a, b in zip(xs, ys, strict=True)):
        return f"top logprob values differ by more than atol={atol}, rtol={rtol}"
    for one, other in ((x, y), (y, x)):
        last = min(one.values())
        for token, logprob in one.items():
            if not close(logprob, last) and not close(other.get(token, -math.inf), logprob):
                return f"the logprob of token {token} differs"
    return ""


def _completion(choice: object) -> Completion:
    extra = choice.model_extra or {}  # type: ignore[attr-defined]
    top = choice.logprobs.top_logprobs  # type: ignore[attr-defined]
    return Completion(
        token_ids=tuple(extra["token_ids"]),
        top_logprobs=tuple(
            MappingProxyType({_token_id(k): v for k, v in candidates.items()}) for candidates in top
        ),
        text=choice.text,  # type: ignore[attr-defined]
    )


def _token_id(key: str) -> int:
    if not key.startswith(_TOKEN_ID_PREFIX):
        raise ValueError(f"expected a {_TOKEN_ID_PREFIX}N logprob key, got {key!r}")
    return int(key.removeprefix(_TOKEN_ID_PREFIX))


def post_json(url: str, body: Mapping[str, object]) -> tuple[int, str]:
    """``POST`` ``body`` as JSON to ``url``; the HTTP status and the response text."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class MonolithicServers:
    """Plain vLLM servers (AFD off), one per (model directory, eager, environment), reused.

    Logs go to ``work_dir``; every server shares ``cache_root``, gets ``extra_args`` on its
    command line and ``base_env`` in its environment (under each call's ``extra_env``).
    Prints the time each server took to become healthy.
    """

    def __init__(
        self,
        work_dir: Path,
        cache_root: Path,
        extra_args: Sequence[str] = (),
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.cache_root = cache_root
        self.extra_args = tuple(extra_args)
        self.base_env = dict(base_env or {})
        self._servers: dict[tuple[Any, ...], VllmServer] = {}

    def get(
        self,
        model: Path,
        enforce_eager: bool = True,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] | None = None,
    ) -> VllmServer:
        """The healthy server of ``model`` with ``extra_env`` set, started on first use.

        ``extra_args`` replaces the arguments given at construction for this server.
        """
        env = tuple(sorted({**self.base_env, **(extra_env or {})}.items()))
        args = self.extra_args if extra_args is None else tuple(extra_args)
        key = (Path(model), enforce_eager, env, args)
        if key not in self._servers:
            (port,) = free_ports(1)
            mode = "eager" if enforce_eager else "compiled"
            suffix = "".join(f"-{k}={v}" for k, v in env)
            if args != self.extra_args:  # its own log: name the arguments by their digest
                suffix += "-args-" + hashlib.sha256("\0".join(args).encode()).hexdigest()[:8]
            spec = ServerSpec(
                name=f"monolithic-{Path(model).name}-{mode}{suffix}",
                model=Path(model),
                port=port,
                enforce_eager=enforce_eager,
                extra_args=args,
                extra_env=MappingProxyType(dict(env)),
            )
            server = VllmServer(spec, self.work_dir, self.cache_root)
            self._servers[key] = server
            server.start()
            try:
                took = server.wait_healthy(time.monotonic() + SERVER_START_TIMEOUT_S)
            except BaseException:
                server.stop()
                del self._servers[key]
                raise
            print(f"{spec.name} healthy after {took:.1f} s")
        return self._servers[key]

    @property
    def sessions(self) -> frozenset[int]:
        """Session ids of the servers kept running."""
        return frozenset(s.pid for s in self._servers.values() if s.pid is not None)

    def stop_all(self) -> None:
        """Stop every server."""
        for server in self._servers.values():
            server.terminate()
        for server in self._servers.values():
            server.stop()
        self._servers.clear()


def leftover_processes(keep: Iterable[int] = ()) -> dict[int, list[int]]:
    """Live processes of servers this process launched: ``{session id: [pids]}``.

    Sessions in ``keep`` (servers meant to outlive the check) are left out.
    """
    kept = set(keep)
    found = {}
    for sid in sorted(started_sessions() - kept):
        pids = session_processes(sid)
        if pids:
            found[sid] = pids
    return found
