"""The prefill/decode proxy against stand-in servers (no vLLM): what each server is sent,
what the client gets back, streaming, and the errors of either server.

The real servers' side (a vLLM prefill server and an AFD attention server handing over
the KV) is tests/e2e_cpu/test_prefill_in_front.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from afd_core.tools.launch.kv_transfer import KVTransferSpec
from afd_core.tools.launch.prefill_proxy import (
    REMOTE_DECODE,
    PrefillDecodeProxy,
    ProxySpec,
    main,
    prompt_count,
)

#: (status, content type, body chunks) a stand-in answers; a chunk may be a callable that
#: runs (e.g. waits) between chunks.
Answer = tuple[int, str, list[Any]]


@dataclass
class StandIn:
    """A stand-in server: records every request and answers with ``answer(path, body)``."""

    answer: Callable[[str, Any], Answer]
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    url: str = ""


@contextmanager
def stand_in(answer: Callable[[str, Any], Answer]) -> Iterator[StandIn]:
    server_state = StandIn(answer)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self, body: Any) -> None:
            server_state.requests.append((self.command, self.path, body))
            status, content_type, chunks = server_state.answer(self.path, body)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in chunks:
                if callable(chunk):
                    chunk()
                    continue
                data = chunk.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            self._serve(json.loads(self.rfile.read(length)))

        def do_GET(self) -> None:
            self._serve(None)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    Handler.protocol_version = "HTTP/1.1"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server_state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def json_answer(body: dict[str, Any], status: int = 200) -> Answer:
    return status, "application/json", [json.dumps(body)]


def completion(text: str, **extra: Any) -> dict[str, Any]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text}], **extra}


def vllm_error(status: int, message: str) -> Answer:
    return json_answer({"error": {"message": message, "type": "x", "code": status}}, status)


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


REQUEST = {
    "model": "m",
    "prompt": "hello",
    "max_tokens": 8,
    "min_tokens": 2,
    "temperature": 0.0,
    "stream": False,
}


def test_a_completion_is_prefilled_with_one_token_then_decoded_as_the_client_sent_it():
    with (
        stand_in(lambda path, body: json_answer(completion("P"))) as prefill,
        stand_in(lambda path, body: json_answer(completion("decoded"))) as decode,
        PrefillDecodeProxy(ProxySpec(prefill.url, decode.url)) as proxy,
    ):
        status, answer = post(proxy.url, REQUEST)
    assert (status, answer["choices"][0]["text"]) == (200, "decoded")
    [(_, path, sent)] = prefill.requests
    assert path == "/v1/completions"
    assert sent == {
        **{k: v for k, v in REQUEST.items() if k != "min_tokens"},
        "max_tokens": 1,
        "kv_transfer_params": dict(REMOTE_DECODE),
    }
    assert decode.requests == [("POST", "/v1/completions", REQUEST)]


def test_the_prefill_servers_kv_transfer_params_go_to_the_decode_server():
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [3]}
    with (
        stand_in(lambda p, b: json_answer(completion("P", kv_transfer_params=params))) as prefill,
        stand_in(lambda path, body: json_answer(completion("decoded"))) as decode,
        PrefillDecodeProxy(ProxySpec(prefill.url, decode.url)) as proxy,
    ):
        assert post(proxy.url, REQUEST)[0] == 200
        status, answer = post(proxy.url, {**REQUEST, "prompt": ["one", "two"]})
    assert [body for _, _, body in decode.requests] == [{**REQUEST, "kv_transfer_params": params}]
    # vLLM answers kv_transfer_params for the first prompt only: a batch cannot use them.
    assert status == 400
    assert "for a request of 2 prompts" in answer["error"]["message"]


def test_a_streamed_answer_reaches_the_client_while_the_decode_server_still_streams():
    first_read = threading.Event()
    events = ['data: {"text": "a"}\n\n', lambda: first_read.wait(10), "data: [DONE]\n\n"]
    with (
        stand_in(lambda path, body: json_answer(completion("P"))) as prefill,
        stand_in(lambda path, body: (200, "text/event-stream", events)) as decode,
        PrefillDecodeProxy(ProxySpec(prefill.url, decode.url)) as proxy,
    ):
        request = urllib.request.Request(
            f"{proxy.url}/v1/completions",
            data=json.dumps({**REQUEST, "stream": True, "stream_options": {"x": 1}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Type"] == "text/event-stream"
            assert response.readline() == b'data: {"text": "a"}\n'
            first_read.set()
            rest = response.read()
    assert rest == b"\ndata: [DONE]\n\n"
    [(_, _, sent)] = prefill.requests
    assert sent["stream"] is False and "stream_options" not in sent


def test_an_http_error_of_the_prefill_server_reaches_the_client_and_skips_decode():
    with (
        stand_in(lambda path, body: vllm_error(404, "The model `m` does not exist.")) as prefill,
        stand_in(lambda path, body: json_answer(completion("decoded"))) as decode,
        PrefillDecodeProxy(ProxySpec(prefill.url, decode.url)) as proxy,
    ):
        status, answer = post(proxy.url, REQUEST)
    assert status == 404
    message = answer["error"]["message"]
    assert message.startswith(f"prefill server {prefill.url} answered POST /v1/completions")
    assert "HTTP 404: The model `m` does not exist." in message
    assert answer["error"]["code"] == 404
    assert decode.requests == []


def test_an_http_error_of_the_decode_server_reaches_the_client_with_its_status():
    with (
        stand_in(lambda path, body: json_answer(completion("P"))) as prefill,
        stand_in(lambda path, body: vllm_error(400, "max_tokens is too large")) as decode,
        PrefillDecodeProxy(ProxySpec(prefill.url, decode.url)) as proxy,
    ):
        status, answer = post(proxy.url, REQUEST)
    assert status == 400
    assert answer["error"]["message"] == (
        f"decode server {decode.url} answered POST /v1/completions with HTTP 400: "
        "max_tokens is too large"
    )


def test_an_unreachable_server_gives_502_and_a_silent_one_504():
    def slow(path: str, body: Any) -> Answer:
        time.sleep(2.0)
        return json_answer(completion("late"))

    with (
        stand_in(slow) as silent,
        PrefillDecodeProxy(ProxySpec(closed_port_url(), silent.url)) as unreachable,
        PrefillDecodeProxy(ProxySpec(silent.url, silent.url, timeout_s=0.3)) as timing_out,
    ):
        status, answer = post(unreachable.url, REQUEST)
        assert status == 502
        assert "prefill server" in answer["error"]["message"]
        assert "ConnectionRefusedError" in answer["error"]["message"]
        begin = time.monotonic()
        status, answer = post(timing_out.url, REQUEST)
        assert time.monotonic() - begin < 1.5
    assert status == 504
    assert answer["error"]["message"] == (
        f"prefill server {silent.url} did not answer POST /v1/completions within 0.3 s"
    )


def test_health_is_200_only_while_both_servers_are_healthy():
    with (
        stand_in(lambda path, body: json_answer({})) as healthy,
        PrefillDecodeProxy(ProxySpec(healthy.url, healthy.url)) as both,
        PrefillDecodeProxy(ProxySpec(healthy.url, closed_port_url())) as decode_down,
    ):
        with urllib.request.urlopen(f"{both.url}/health", timeout=10) as response:
            assert response.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{decode_down.url}/health", timeout=10)
    assert refused.value.code == 503
    assert "decode server" in json.loads(refused.value.read())["error"]["message"]


def test_models_are_the_decode_servers_and_other_paths_are_404():
    with (
        stand_in(lambda path, body: json_answer({"data": [{"id": "m"}]})) as server,
        PrefillDecodeProxy(ProxySpec(server.url, server.url)) as proxy,
    ):
        with urllib.request.urlopen(f"{proxy.url}/v1/models", timeout=10) as response:
            assert json.loads(response.read()) == {"data": [{"id": "m"}]}
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{proxy.url}/v1/embeddings", timeout=10)
    assert missing.value.code == 404


def test_a_body_that_is_not_a_json_object_is_400():
    with (
        stand_in(lambda path, body: json_answer({})) as server,
        PrefillDecodeProxy(ProxySpec(server.url, server.url)) as proxy,
    ):
        request = urllib.request.Request(f"{proxy.url}/v1/completions", data=b"[1, 2")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert server.requests == []


@pytest.mark.parametrize(
    ("prompt", "count"),
    [("a", 1), ([1, 2, 3], 1), (["a", "b"], 2), ([[1], [2], [3]], 3), (None, 1)],
)
def test_prompt_count_reads_the_completions_prompt_forms(prompt: Any, count: int):
    assert prompt_count(prompt) == count


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "https://h:1", "http://h", "http://h:1/v1"])
def test_a_server_url_that_is_not_a_plain_http_base_url_is_refused(url: str):
    with pytest.raises(ValueError, match="must be http://HOST:PORT"):
        ProxySpec(url, "http://127.0.0.1:8000")
    with pytest.raises(SystemExit) as exited:
        main(["--prefill", url, "--decode", "http://127.0.0.1:8000"])
    assert exited.value.code == 2


def test_kv_transfer_spec_renders_vllms_flag():
    spec = KVTransferSpec.shared_storage("kv_consumer", Path("/tmp/kv"))
    flag, config = spec.args()
    assert flag == "--kv-transfer-config"
    assert json.loads(config) == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"},
    }
