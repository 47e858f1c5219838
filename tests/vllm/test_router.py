"""The router in front of two real vLLM replicas, driven by the official `openai` client.

Covers the four OpenAI shapes the router relays (chat/completions x streamed/not), prefix
affinity measured by vLLM itself (the chosen replica's `vllm:prefix_cache_hits_total` rises and
the other replica sees no query at all), and the load scrape reading vLLM's real metric names.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from loadtest.vllm_fleet import VllmFleet
from tests.conftest import ThreadedServer

from ._prompts import chat, prose
from .conftest import router_settings

if TYPE_CHECKING:
    from .conftest import RouterUnderTest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPLICA_HEADER = "x-prefix-router-replica"


def test_chat_not_streamed(
    fleet: VllmFleet, router: RouterUnderTest, openai_client, unique
) -> None:
    client = openai_client(router.url)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-llama",
        messages=chat(unique, "hello"),
        max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    resp = raw.parse()
    assert raw.headers[REPLICA_HEADER] in fleet.names
    assert resp.object == "chat.completion"
    assert resp.usage.completion_tokens == 5
    assert isinstance(resp.choices[0].message.content, str)


def test_chat_streamed(fleet: VllmFleet, router: RouterUnderTest, openai_client, unique) -> None:
    client = openai_client(router.url)
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=chat(unique, "hello"),
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]


def test_completions_not_streamed(
    fleet: VllmFleet, router: RouterUnderTest, openai_client, unique
) -> None:
    client = openai_client(router.url)
    resp = client.completions.create(
        model="tiny-llama", prompt=prose(unique, 80), max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert resp.object == "text_completion"
    assert resp.usage.completion_tokens == 4 and isinstance(resp.choices[0].text, str)


def test_completions_streamed(
    fleet: VllmFleet, router: RouterUnderTest, openai_client, unique
) -> None:
    client = openai_client(router.url)
    stream = client.completions.create(
        model="tiny-llama",
        prompt=prose(unique, 80),
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_models_listed_through_router(router: RouterUnderTest, openai_client) -> None:
    models = openai_client(router.url).models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]


def test_same_prefix_hits_only_the_chosen_replica(
    fleet: VllmFleet, router: RouterUnderTest, openai_client, unique
) -> None:
    client = openai_client(router.url)
    before = [fleet.prefix_cache(i) for i in range(fleet.n)]
    chosen: list[str] = []
    prompt_tokens: list[int] = []
    cached: list[int] = []
    for question in ("first question", "second question", "third question"):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-llama", messages=chat(unique, question), max_tokens=1
        )
        usage = raw.parse().usage
        chosen.append(raw.headers[REPLICA_HEADER])
        prompt_tokens.append(usage.prompt_tokens)
        cached.append(usage.prompt_tokens_details.cached_tokens)
    after = [fleet.prefix_cache(i) for i in range(fleet.n)]
    assert len(set(chosen)) == 1, chosen
    home = fleet.names.index(chosen[0])
    other = 1 - home
    hits = after[home][1] - before[home][1]
    print(f"\nhome {chosen[0]}: prompt tokens {prompt_tokens}, cached {cached}, hits +{hits:.0f}")
    # the shared system prompt is hundreds of tokens: all its full blocks hit on requests 2 and 3
    assert cached[0] == 0 and cached[1] >= 10 * 32 and cached[2] == cached[1]
    assert hits == sum(cached)
    assert after[home][0] - before[home][0] == sum(prompt_tokens)
    assert after[other] == before[other], "the other replica saw none of these prompts"


def test_router_scrapes_real_vllm_load(fleet: VllmFleet, unique,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scrape the router makes during a long generation is recorded as the policy sees
    it (the replica's state after the scrape); one of them must show the request running.

    Measured on this 2-core VM: while a CPU replica generates, other processes can get no CPU
    for 1-14 s at a time, so this router's scrape may start late and its answer arrive seconds
    after vLLM wrote it. The scrape timeout is therefore generous, and the test reads the record
    rather than racing the next scrape for the live state."""
    from router.app import create_app

    app = create_app(router_settings(fleet, health={"timeout": 30.0}))
    seen: list[tuple[str, float, float]] = []
    scrape_one = app.health.scrape_one

    async def recorded(session: Any, replica: Any) -> None:
        await scrape_one(session, replica)
        seen.append((replica.name, replica.running, replica.kv_usage))

    monkeypatch.setattr(app.health, "scrape_one", recorded)
    body = {
        "model": "tiny-llama",
        "messages": chat(unique, "go on"),
        "max_tokens": 3000,  # a long generation: the replica stays busy while the scrape looks
        "stream": True,
        "ignore_eos": True,
    }

    def busy(name: str) -> list[tuple[str, float, float]]:
        return [s for s in seen if s[0] == name and s[1] >= 1 and s[2] > 0]

    names: set[str] = set()
    deadline = time.monotonic() + 180
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        # Nothing else runs on the fleet now: the replica is busy only with these requests.
        # When starvation kept every scrape out of one generation, the same prompt goes again
        # (same prefix, same replica), at most 4 times.
        for _ in range(4):
            with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                name = resp.headers[REPLICA_HEADER]
                names.add(name)
                # read as fast as vLLM writes: the stream ends when the generation does
                looked = 0
                for _ in resp.iter_lines():
                    if len(seen) > looked:  # a scrape answered since the last look
                        looked = len(seen)
                        if busy(name):
                            break
                    if time.monotonic() > deadline:
                        break
            # a scrape sent during the generation may answer only now (this process was starved):
            # wait for the scrapes in flight, i.e. until both replicas were scraped once more
            after = len(seen) + 2
            while not busy(name) and len(seen) < after and time.monotonic() < deadline:
                time.sleep(0.05)
            if busy(name) or time.monotonic() > deadline:
                break
    assert len(names) == 1, names
    failures = [line for line in app.metrics.render()[0].decode().splitlines()
                if line.startswith("prefix_router_scrape_failures_total{")]
    ours = [s for s in seen if s[0] == name]
    assert busy(name), f"no scrape of {name} saw it busy: {ours}; scrape failures: {failures}"
