"""``GET /afd/status`` on a vLLM API server of either role: AFD readiness for probes;
and the ``afd:`` metrics appended to its ``/metrics``.

vLLM's ``/health`` says the engine is alive. An FFN server is healthy as soon as its
model is loaded, while its FFN rank still waits for the attention ranks; a probe that
must know whether the rank serves reads ``/afd/status`` instead. Add it to a server with
vLLM's own flag (every launch that :mod:`afd_core.tools.launch` makes does)::

    --middleware afd_core.http_status.AFDStatusMiddleware

The answer is JSON: ``{"ready": bool, "workers": [...]}``, one record per worker of the
server (``afd_status`` over vLLM's ``collective_rpc``: :meth:`FFNServer.status
<afd_ffn.server.FFNServer.status>` on the FFN role; on the attention role whether the AFD
session is open), with HTTP 200 when every worker is ready and 503 otherwise. A worker
that does not answer within :data:`STATUS_TIMEOUT_S` (an engine busy in a step that
waits for a lost peer, a dead engine) gives 503 with ``"error"``; the request never
waits longer.

``GET /metrics`` goes to vLLM's handler as before (asked for uncompressed text), and
the middleware appends the ``afd:`` families of :mod:`afd_core.metrics`, built from every
worker's ``afd_stats`` and ``afd_status`` at this scrape (bounded by
:data:`STATUS_TIMEOUT_S`; ``afd:scrape_ok`` 0 when they do not answer). Other paths pass
through untouched.

This module imports no vLLM and no torch: the middleware reads the engine client vLLM's
API server keeps in ``app.state.engine_client``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

#: The path answered.
STATUS_PATH = "/afd/status"
#: The worker method asked, on every worker of the server.
STATUS_METHOD = "afd_status"
#: The metrics path, and the worker method whose counters it adds.
METRICS_PATH = "/metrics"
STATS_METHOD = "afd_stats"
#: Seconds the answer waits for the workers.
STATUS_TIMEOUT_S = 5.0

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _NoAnswer(Exception):
    """The workers gave no answer (its text says why)."""


async def _ask_workers(engine_client: Any, *methods: str) -> list[list[dict[str, Any]]]:
    """Every worker's answer to each of ``methods``, asked at once and bounded by
    :data:`STATUS_TIMEOUT_S`; _NoAnswer when there is no engine or no answer in time."""
    if engine_client is None:
        raise _NoAnswer("this API server has no engine")
    timeout_s = STATUS_TIMEOUT_S
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(*(engine_client.collective_rpc(m) for m in methods)), timeout_s
        )
    except TimeoutError:
        raise _NoAnswer(f"the workers did not answer within {timeout_s:g} s") from None
    except Exception as exc:  # a dead engine, a worker without the method
        raise _NoAnswer(f"{type(exc).__name__}: {exc}") from exc
    return [list(answer) for answer in answers]


async def read_status(engine_client: Any) -> dict[str, Any]:
    """``{"ready", "workers"}`` from ``engine_client`` (vLLM's ``EngineClient``), or
    ``{"ready": False, "error"}`` when the workers do not answer (:func:`_ask_workers`)."""
    try:
        (workers,) = await _ask_workers(engine_client, STATUS_METHOD)
    except _NoAnswer as exc:
        return {"ready": False, "error": str(exc)}
    ready = bool(workers) and all(bool(w.get("ready")) for w in workers)
    return {"ready": ready, "workers": workers}


async def read_metrics(engine_client: Any) -> str:
    """The ``afd:`` Prometheus text of ``engine_client``'s workers (their ``afd_stats``
    and ``afd_status``), ``afd:scrape_ok`` 0 alone when they do not answer."""
    from afd_core.metrics import exposition

    try:
        stats, status = await _ask_workers(engine_client, STATS_METHOD, STATUS_METHOD)
    except _NoAnswer:
        return exposition(None)
    workers = [
        {
            "role": st.get("role", "?"),
            "rank": st.get("ffn_rank", st.get("attention_rank", "?")),
            "stats": sa,
            "status": st,
        }
        for sa, st in zip(stats, status, strict=False)
    ]
    return exposition(workers)


class AFDStatusMiddleware:
    """The ASGI middleware that answers :data:`STATUS_PATH` (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope.get("type") != "http" or path not in (STATUS_PATH, METRICS_PATH):
            await self.app(scope, receive, send)
            return
        state = getattr(scope.get("app"), "state", None)
        engine = getattr(state, "engine_client", None)
        if path == METRICS_PATH:
            if scope.get("method") != "GET":
                await self.app(scope, receive, send)
                return
            await _metrics_with_afd(self.app, scope, receive, send, engine)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _respond(send, 405, {"error": f"{STATUS_PATH} answers GET only"})
            return
        body = await read_status(engine)
        await _respond(send, 200 if body["ready"] else 503, body)


async def _metrics_with_afd(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, engine: Any
) -> None:
    """vLLM's ``/metrics`` answer (uncompressed), with the ``afd:`` text appended when it
    succeeded; any other answer passes as it was."""
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]
    start: MutableMapping[str, Any] | None = None
    chunks: list[bytes] = []

    async def buffered(message: MutableMapping[str, Any]) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app({**scope, "headers": headers}, receive, buffered)
    if start is None:
        return
    body = b"".join(chunks)
    if start.get("status") == 200:
        body += (await read_metrics(engine)).encode()
    kept = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    await send({**start, "headers": [*kept, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _respond(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
