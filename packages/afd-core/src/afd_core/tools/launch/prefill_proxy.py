"""A prefill server in front of AFD decode: the proxy that sends each request to both.

:class:`PrefillDecodeProxy` serves the OpenAI completions API (``POST /v1/completions``)
and answers each request with two calls:

1. to the **prefill server** (plain vLLM, a KV producer): a copy of the request with
   ``max_tokens`` 1, not streamed, with ``kv_transfer_params`` asking for a remote decode
   (:data:`REMOTE_DECODE`, vLLM's convention: ``NixlConnector`` answers with what the
   decode side needs to pull the KV; ``ExampleConnector`` ignores it and finds the KV by
   the prompt's tokens);
2. to the **decode server** (the AFD attention server, a KV consumer): the request as the
   client sent it, plus the ``kv_transfer_params`` of the prefill server's answer, if any.
   Its answer, streamed or not, goes to the client.

An HTTP error of either server reaches the client with its status and a message naming
that server; an unreachable server gives 502 and one silent for ``timeout_s`` 504. vLLM
answers ``kv_transfer_params`` for the first prompt of a request only, so a request of
several prompts is refused (400) when the prefill server answers any. ``GET /v1/models``
is the decode server's answer; ``GET /health`` is 200 when both servers' ``/health`` are.

Standard library only, a thread per connection: for tests, demos and small deployments.
``python -m afd_core.tools.launch.prefill_proxy --prefill URL --decode URL --port P`` runs one
until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from afd_core.errors import AFDError

#: What the prefill copy of every request carries as ``kv_transfer_params``.
REMOTE_DECODE: Mapping[str, Any] = MappingProxyType(
    {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
)
COMPLETIONS_PATH = "/v1/completions"
DEFAULT_TIMEOUT_S = 120.0
#: Bound on each server's ``/health`` call when the proxy's ``/health`` is asked.
HEALTH_TIMEOUT_S = 5.0
#: The longest upstream error text quoted to the client.
_MAX_QUOTED = 2000
_STREAM_READ_BYTES = 64 * 1024
#: How often the serving thread checks for :meth:`PrefillDecodeProxy.stop`.
_STOP_POLL_S = 0.1

_log = logging.getLogger(__name__)


class ProxyError(AFDError):
    """What the proxy answers instead of a completion: ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ProxySpec:
    """Where the proxy listens and whom it calls.

    ``prefill_url`` and ``decode_url``: base URLs (``http://host:port``) of the prefill
    server and of the AFD attention server. ``port`` 0 lets the OS pick (see
    :attr:`PrefillDecodeProxy.url`). ``timeout_s`` bounds the connect and every read of
    each upstream call (a streamed answer may take longer in all, never longer silent).
    """

    prefill_url: str
    decode_url: str
    host: str = "127.0.0.1"
    port: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("prefill_url", "decode_url"):
            _host_port(name, getattr(self, name))
        if self.timeout_s <= 0:
            raise ValueError(f"ProxySpec.timeout_s must be positive, not {self.timeout_s}")


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill server's copy of a completions request: one token, not streamed, with
    :data:`REMOTE_DECODE` as its ``kv_transfer_params``."""
    copy = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    copy.update(max_tokens=1, stream=False, kv_transfer_params=dict(REMOTE_DECODE))
    return copy


def decode_body(body: Mapping[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The decode server's request: ``body`` with the prefill server's
    ``kv_transfer_params`` (left as the client sent it when those are None).

    Raises ProxyError (400) when there are parameters and ``body`` holds several prompts:
    vLLM answers them for the first prompt only.
    """
    if kv_transfer_params is None:
        return dict(body)
    prompts = prompt_count(body.get("prompt"))
    if prompts != 1:
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"the prefill server answered kv_transfer_params for a request of {prompts} "
            "prompts; vLLM returns them for the first prompt only, so send one prompt per "
            "request with this KV connector",
        )
    return {**body, "kv_transfer_params": kv_transfer_params}


def prompt_count(prompt: Any) -> int:
    """How many prompts a completions ``prompt`` holds (a string or a list of token ids is
    one; a list of strings or of token-id lists is one per entry)."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


class PrefillDecodeProxy:
    """Serves :class:`ProxySpec` from a background thread; see the module docstring.

    Use as a context manager (``with PrefillDecodeProxy(spec) as proxy: ... proxy.url``)
    or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, spec: ProxySpec) -> None:
        self.spec = spec
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL clients use (``http://host:port``); known once started."""
        if self._server is None:
            raise AFDError("prefill proxy: not started; call start() first")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Bind ``spec.host:spec.port`` and serve in a daemon thread (returns at once).
        Raises OSError when the port is taken."""
        if self._server is not None:
            raise AFDError("prefill proxy: already started")
        self._server = _ProxyServer((self.spec.host, self.spec.port), self.spec)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(_STOP_POLL_S,),
            name="prefill-proxy",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting requests and close the listening socket; idempotent. Requests
        in flight finish in their own daemon threads, each call bounded by
        ``spec.timeout_s``."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        thread.join()

    def __enter__(self) -> PrefillDecodeProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], spec: ProxySpec) -> None:
        self.prefill = _Upstream("prefill server", spec.prefill_url, spec.timeout_s)
        self.decode = _Upstream("decode server", spec.decode_url, spec.timeout_s)
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _ProxyServer

    def do_POST(self) -> None:
        try:
            if self.path != COMPLETIONS_PATH:
                raise ProxyError(HTTPStatus.NOT_FOUND, f"POST {self.path}: only {COMPLETIONS_PATH}")
            self._complete(self._read_json())
        except ProxyError as exc:
            self._send_error(exc)

    def do_GET(self) -> None:
        try:
            if self.path == "/health":
                self._health()
            elif self.path == "/v1/models":
                with self.server.decode.call("GET", self.path) as response:
                    self._relay(response)
            else:
                raise ProxyError(HTTPStatus.NOT_FOUND, f"GET {self.path}: not served by the proxy")
        except ProxyError as exc:
            self._send_error(exc)

    def _complete(self, body: dict[str, Any]) -> None:
        prefill = self.server.prefill
        with (
            prefill.call("POST", self.path, prefill_body(body)) as response,
            prefill.errors(f"POST {self.path}"),
        ):
            raw = response.read()
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise ProxyError(
                HTTPStatus.BAD_GATEWAY, f"{prefill}: answer is not JSON: {exc}"
            ) from exc
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        with self.server.decode.call("POST", self.path, decode_body(body, params)) as response:
            self._relay(response)

    def _health(self) -> None:
        """200 when both servers answer ``/health`` with 2xx, else 503 naming the first
        that does not."""
        for upstream in (self.server.prefill, self.server.decode):
            try:
                with upstream.call("GET", "/health", timeout_s=HEALTH_TIMEOUT_S):
                    pass
            except ProxyError as exc:
                raise ProxyError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) from exc
        self._send(HTTPStatus.OK, b"", "text/plain")

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise ProxyError(HTTPStatus.BAD_REQUEST, f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ProxyError(HTTPStatus.BAD_REQUEST, "request body must be a JSON object")
        return body

    def _relay(self, response: http.client.HTTPResponse) -> None:
        """Copy an upstream 2xx answer to the client as it arrives (SSE streams too); the
        connection closes at its end."""
        self.send_response(response.status)
        self.send_header("Content-Type", response.getheader("Content-Type", "application/json"))
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            while chunk := response.read1(_STREAM_READ_BYTES):
                self.wfile.write(chunk)
                self.wfile.flush()
        except (OSError, http.client.HTTPException) as exc:
            # The status line is sent: all that is left is to cut the answer short.
            _log.warning("prefill proxy: answer to %s cut short: %r", self.path, exc)

    def _send_error(self, error: ProxyError) -> None:
        status = HTTPStatus(error.status)
        info = {"message": str(error), "type": status.phrase, "param": None, "code": int(status)}
        self._send(status, json.dumps({"error": info}).encode(), "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        _log.info("prefill proxy: " + format, *args)


@dataclass(frozen=True)
class _Upstream:
    """The prefill or the decode server, as the proxy calls it."""

    name: str
    url: str
    timeout_s: float

    def __str__(self) -> str:
        return f"{self.name} {self.url}"

    @contextmanager
    def call(
        self, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> Iterator[http.client.HTTPResponse]:
        """One call: yields the server's 2xx response, unread; closes the connection
        after. Raises ProxyError with the server's status and message for an HTTP error,
        or as :meth:`errors` says."""
        host, port = _host_port(self.name, self.url)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        what = f"{method} {path}"
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            with self.errors(what, timeout_s):
                payload = None if body is None else json.dumps(body).encode()
                headers = {} if payload is None else {"Content-Type": "application/json"}
                connection.request(method, path, body=payload, headers=headers)
                response = connection.getresponse()
                if not 200 <= response.status < 300:
                    detail = _error_message(response.read())
                    raise ProxyError(
                        response.status,
                        f"{self} answered {what} with HTTP {response.status}: {detail}",
                    )
            yield response
        finally:
            connection.close()

    @contextmanager
    def errors(self, what: str, timeout_s: float | None = None) -> Iterator[None]:
        """Turn a failed exchange with this server into ProxyError: 504 when it was silent
        for the timeout, 502 when it could not be reached or broke the HTTP exchange."""
        try:
            yield
        except TimeoutError as exc:
            seconds = self.timeout_s if timeout_s is None else timeout_s
            raise ProxyError(
                HTTPStatus.GATEWAY_TIMEOUT, f"{self} did not answer {what} within {seconds} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ProxyError(HTTPStatus.BAD_GATEWAY, f"{self} failed {what}: {exc!r}") from exc


def _error_message(raw: bytes) -> str:
    """The message of a vLLM/OpenAI error body (``{"error": {"message": ...}}``), else the
    body's text, cut to a readable length."""
    text = raw.decode(errors="replace")
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        message = None
    return (message if isinstance(message, str) else text)[:_MAX_QUOTED]


def _host_port(what: str, url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"{what} must be http://HOST:PORT (a base URL, no path), not {url!r}")
    return parts.hostname, port


def main(argv: Sequence[str] | None = None) -> int:
    """Run a proxy until Ctrl-C; returns the exit status (2: invalid arguments)."""
    parser = argparse.ArgumentParser(
        prog="python -m afd_core.tools.launch.prefill_proxy",
        description="Send each completion to a prefill server (max_tokens 1), then to the "
        "decode (AFD attention) server, whose answer the client gets.",
    )
    parser.add_argument("--prefill", required=True, help="prefill server, http://HOST:PORT")
    parser.add_argument("--decode", required=True, help="AFD attention server, http://HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8300, help="port to listen on")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a server may be silent"
    )
    args = parser.parse_args(argv)
    try:
        spec = ProxySpec(args.prefill, args.decode, args.host, args.port, args.timeout)
        proxy = PrefillDecodeProxy(spec)
        proxy.start()
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(f"prefill proxy on {proxy.url}: prefill {spec.prefill_url}, decode {spec.decode_url}")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
