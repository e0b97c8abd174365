"""The load of ``test_load_loses_nothing_and_matches_monolithic`` (test_afd_exactness.py).

Each request is one prompt of a seeded workload (prompt lengths and ``max_tokens`` vary),
greedy, EOS ignored, sent through the official ``openai`` client.

* At concurrency 1 every AFD completion must equal monolithic vLLM's at concurrency 1.
* At concurrency 32 the engine batches requests differently from run to run, and bf16
  rounding of a different batch can flip a near-tied greedy token of a prompt the tiny
  models were not sharpened on, even between two monolithic runs. So the test counts
  the completions of a second monolithic run (concurrency 32) that differ from the
  first, and asserts that AFD (concurrency 32) differs no more often, up to the sampling
  noise of such counts (:func:`noise_margin`). A wrong FFN result changes nearly every
  completion, far beyond that margin.

``AFD_LOAD_REQUESTS`` sets the number of requests (default 240); ``nox -s soak`` runs the
load test with 1,000.
"""

from __future__ import annotations

import math
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from afd_models.tiny.specs import PROMPTS
from tests.e2e_cpu.harness import REQUEST_TIMEOUT_S

REQUESTS = int(os.environ.get("AFD_LOAD_REQUESTS", "240"))
CONCURRENCY = 32
#: The words of the tiny models' own prompts, recombined into new prompts.
_WORDS = sorted({word for prompt in PROMPTS for word in prompt.replace(",", "").split()})


def workload(count: int, seed: int = 0) -> list[tuple[str, int]]:
    """``count`` (prompt, max_tokens) pairs: 1-24 words, 1-24 new tokens, seeded."""
    rng = random.Random(seed)
    return [
        (" ".join(rng.choices(_WORDS, k=rng.randint(1, 24))), rng.randint(1, 24))
        for _ in range(count)
    ]


def run_load(
    endpoints: list[str], requests: list[tuple[str, int]], concurrency: int
) -> list[tuple[int, ...]]:
    """Token ids of every request, sent ``concurrency`` at a time, spread round-robin over
    ``endpoints``; raises the first error (a lost or failed request fails the test)."""
    import openai

    clients = [
        openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0
        )
        for url in endpoints
    ]
    model = clients[0].models.list().data[0].id
    lock = threading.Lock()
    done = [0]

    def one(i: int) -> tuple[int, ...]:
        prompt, max_tokens = requests[i]
        response = clients[i % len(clients)].completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        (choice,) = response.choices
        tokens = tuple((choice.model_extra or {})["token_ids"])
        assert len(tokens) == max_tokens, (i, prompt, max_tokens, tokens)
        with lock:
            done[0] += 1
        return tokens

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, range(len(requests))))
    finally:
        for client in clients:
            client.close()
    assert done[0] == len(requests)
    return results


def differing(run: list[tuple[int, ...]], reference: list[tuple[int, ...]]) -> int:
    """How many completions of ``run`` differ from ``reference``'s."""
    return sum(a != b for a, b in zip(run, reference, strict=True))


def noise_margin(count: int) -> float:
    """Allowance for chance between two counts of rare, independent flips: three standard
    deviations of a Poisson count of mean ``count`` (at least 3)."""
    return 3.0 * math.sqrt(max(count, 1))


@dataclass(frozen=True)
class LoadReference:
    """Monolithic vLLM on the workload: the requests, its tokens at concurrency 1, and how
    many completions of a second run at :data:`CONCURRENCY` differ from those."""

    requests: list[tuple[str, int]]
    tokens: list[tuple[int, ...]]
    second_run_differing: int

    @classmethod
    def measure(cls, url: str, count: int) -> LoadReference:
        """Both monolithic runs of ``count`` requests on the server at ``url``."""
        requests = workload(count)
        tokens = run_load([url], requests, 1)
        second = differing(run_load([url], requests, CONCURRENCY), tokens)
        return cls(requests, tokens, second)
