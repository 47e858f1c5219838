"""cache_aware end to end: the router in front of simulated vLLM replicas on 127.0.0.1.

Real HTTP all the way (the official openai client -> router -> `loadtest.replica` processes,
which report `usage.prompt_tokens_details.cached_tokens` like vLLM). Bounded in requests and
time; the fleets are stopped by PID.
"""

from __future__ import annotations

import concurrent.futures
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest._net import quiet_port
from loadtest.fleet import Fleet
from router.chunks import request_chunks
from router.keys import derive
from tests.integration.conftest import router_settings

SYSTEM = "You are the support assistant of the ACME billing platform. " * 30


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[Fleet]:
    with Fleet(replicas=3, speed=20.0, kv_blocks=2000) as f:
        yield f


def _metrics(url: str) -> dict[tuple[str, str], float]:
    """(sample name, the label value that matters here) -> value, summed over the rest."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            k = (s.name, s.labels.get("branch") or s.labels.get("reason", ""))
            out[k] = out.get(k, 0.0) + s.value
    return out


def _ask(c: openai.OpenAI, messages: list[dict[str, Any]], stream: bool) -> tuple[str, int, str]:
    """(replica, reported cached tokens, answer text)."""
    if stream:
        with c.chat.completions.with_streaming_response.create(
                model="sim-model", messages=messages, max_tokens=8, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True}) as resp:
            replica = resp.headers["x-prefix-router-replica"]
            text, cached = "", -1
            for chunk in resp.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                    cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
            return replica, cached, text
    raw = c.chat.completions.with_raw_response.create(
        model="sim-model", messages=messages, max_tokens=8)  # type: ignore[arg-type]
    done = raw.parse()
    details = done.usage.prompt_tokens_details if done.usage else None
    return (raw.headers["x-prefix-router-replica"], (details.cached_tokens or 0) if details else -1,
            done.choices[0].message.content or "")


def test_conversations_keep_their_replica_and_counters_move(sim_fleet: Fleet,
                                                           router_server: Any) -> None:
    srv, _ = router_server(router_settings(sim_fleet.urls, routing={"policy": "cache_aware"}))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    reported = 0
    where: dict[int, set[str]] = {}
    for turn in range(3):
        for conv in range(6):
            msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
            for t in range(turn + 1):
                msgs.append({"role": "user", "content": f"conversation {conv} question {t}"})
                if t < turn:
                    msgs.append({"role": "assistant", "content": f"answer {conv}.{t} " * 20})
            replica, cached, _ = _ask(c, msgs, stream=(conv + turn) % 2 == 0)
            assert cached >= 0  # both the body and the final streamed chunk carry usage
            reported += cached
            where.setdefault(conv, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in where.values()), where
    m = _metrics(srv.url)
    predicted = m[("prefix_router_predicted_cached_tokens_total", "")]
    got = m[("prefix_router_reported_cached_tokens_total", "")]
    assert got == reported > 0
    # follow-up turns were predicted as hits: within a factor of the replicas' own count
    assert 0.5 * reported < predicted < 2 * reported
    assert m[("prefix_router_requests_total", "cache_hit")] >= 12  # every turn after the first of each conversation


def test_a_hot_prompt_spreads_under_load(router_server: Any) -> None:
    # slow replicas (speed 1: a 1.5k-token prefill takes ~150 ms), 48 concurrent streams of one
    # hot prompt: queueing on its replica soon costs more than cold prefills elsewhere
    with Fleet(replicas=3, speed=1.0, kv_blocks=2000) as slow:
        srv, _ = router_server(router_settings(slow.urls, routing={"policy": "cache_aware"}))
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        hot = "You are the hot assistant everyone uses. " * 150

        def one(i: int) -> str:
            msgs = [{"role": "system", "content": hot}, {"role": "user", "content": f"q {i}"}]
            return _ask(c, msgs, stream=True)[0]

        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            replicas = list(pool.map(one, range(96)))
    counts = {r: replicas.count(r) for r in set(replicas)}
    assert len(counts) >= 2, counts  # replicated once queueing beat a cold prefill
    assert max(counts.values()) < 96


def test_a_retried_request_is_indexed_on_the_replica_that_answered(sim_fleet: Fleet,
                                                                   router_server: Any) -> None:
    dead = f"http://127.0.0.1:{quiet_port()}"  # nothing listens: connect refused
    settings = router_settings([dead, sim_fleet.urls[0]], routing={"policy": "cache_aware"},
                               health={"interval": 30.0, "eject_after": 100})
    srv, app = router_server(settings)
    # a system prompt whose ring home is the dead replica (r0), found by the router's own code
    for i in range(200):
        body = {"model": "sim-model", "max_tokens": 4,
                "messages": [{"role": "system", "content": f"variant {i}: " + SYSTEM},
                             {"role": "user", "content": "hello"}]}
        key = derive("/v1/chat/completions", {}, body, app.router.key_config)
        if next(app.replicas.ring.walk(key.ring_key)) == "r0":
            break
    else:
        pytest.fail("no prompt homed on r0")
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(**body)
    assert raw.headers["x-prefix-router-replica"] == "r1"
    m = _metrics(srv.url)
    assert m[("prefix_router_retries_total", "connect")] == 1.0
    chunks = request_chunks("/v1/chat/completions", body)
    assert app.router.index.match(chunks) == {"r1": chunks.total}


def test_a_burst_waits_for_the_first_prefill_instead_of_repeating_it(router_server: Any) -> None:
    # slow replicas (speed 1: a 4k-token prefill takes two 2k-token steps, ~400 ms) and 6
    # concurrent streams of one new prompt: the router holds the ones that reach the first
    # one's replica until its first token, so they find the whole prefix cached instead of
    # computing it again alongside it (without the hold they find only the first step's 2048)
    with Fleet(replicas=2, speed=1.0, kv_blocks=2000) as slow:
        srv, _ = router_server(router_settings(slow.urls, routing={"policy": "cache_aware"}))
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        new = "You are the assistant of a brand new product launch. " * 300

        def one(i: int) -> tuple[str, int, str]:
            msgs = [{"role": "system", "content": new}, {"role": "user", "content": f"q {i}"}]
            return _ask(c, msgs, stream=True)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(one, range(6)))
        with urllib.request.urlopen(srv.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    held = {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "prefix_router_hold_seconds_count"}
    assert held.get("answered", 0) >= 1 and held.get("timeout", 0) == 0, held
    prefix = max(cached for _, cached, _ in answers)
    assert prefix > 3000, answers
    assert sum(1 for _, cached, _ in answers if cached == prefix) >= held["answered"], answers
