"""``GET /afd/status``: the middleware's answers for ready, waiting, silent and broken
engines, and other paths passed through untouched (ASGI calls, fake engine clients)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from afd_core import http_status
from afd_core.http_status import STATUS_METHOD, STATUS_PATH, AFDStatusMiddleware


class Engine:
    """An engine client whose ``collective_rpc`` answers ``workers`` (or raises ``error``,
    or sleeps ``delay_s`` first)."""

    def __init__(self, workers=(), error: Exception | None = None, delay_s: float = 0.0):
        self.workers, self.error, self.delay_s = list(workers), error, delay_s
        self.methods: list[str] = []

    async def collective_rpc(self, method: str) -> list[dict[str, Any]]:
        self.methods.append(method)
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return self.workers


def call(engine: Any, path: str = STATUS_PATH, method: str = "GET") -> tuple[Any, list]:
    """One request through the middleware: (what the inner app saw, the messages sent)."""
    seen: list[str] = []

    async def inner(scope, receive, send):
        seen.append(scope["path"])

    sent: list[dict[str, Any]] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    app = SimpleNamespace(state=SimpleNamespace(engine_client=engine))
    scope = {"type": "http", "path": path, "method": method, "app": app}
    asyncio.run(AFDStatusMiddleware(inner)(scope, receive, send))
    return seen, sent


def answer(sent: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    start, body = sent
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    return start["status"], json.loads(body["body"])


def test_every_worker_ready_is_200_with_their_records():
    workers = [{"role": "ffn", "ready": True, "state": "serving"}]
    engine = Engine(workers)
    seen, sent = call(engine)
    assert seen == [] and engine.methods == [STATUS_METHOD]
    assert answer(sent) == (200, {"ready": True, "workers": workers})


def test_one_worker_not_ready_is_503():
    workers = [{"ready": True}, {"ready": False, "state": "waiting for attention ranks"}]
    status, body = answer(call(Engine(workers))[1])
    assert status == 503 and body["ready"] is False and body["workers"] == workers


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (None, "no engine"),
        (Engine(error=RuntimeError("engine dead")), "RuntimeError: engine dead"),
        (Engine(delay_s=1.0), "did not answer within 0.05 s"),
        (Engine([]), None),
    ],
)
def test_no_answer_is_503_and_says_why(engine, message, monkeypatch):
    monkeypatch.setattr(http_status, "STATUS_TIMEOUT_S", 0.05)
    status, body = answer(call(engine)[1])
    assert status == 503 and body["ready"] is False
    if message is not None:
        assert message in body["error"]


def test_other_paths_and_methods():
    engine = Engine([{"ready": True}])
    seen, sent = call(engine, path="/health")
    assert seen == ["/health"] and sent == [] and engine.methods == []
    status, body = answer(call(engine, method="POST")[1])
    assert status == 405 and "GET" in body["error"]
