"""End to end: the official openai client -> real uvicorn router -> real replica servers.

Fake replicas (tests/integration/conftest.py) answer with their own name, so the content of a
completion says where it was served; the kill test uses the simulated vLLM fleet in separate
processes so a replica can really be SIGKILLed mid-run.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import Fleet, router_settings

SYSTEM = ("You are the returns assistant of an online bookshop. Be concise, polite, and always "
          "ask for the order number first.")


def client(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0, **kw)


def messages(system: str, user: str) -> list[Any]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def ask(c: openai.OpenAI, system: str, text: str, stream: bool, **kw: Any) -> str:
    if stream:
        chunks = c.chat.completions.create(model="fake-model", messages=messages(system, text),
                                           stream=True, **kw)
        parts = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
        return parts[0]  # the fake's first delta is its name
    r = c.chat.completions.create(model="fake-model", messages=messages(system, text), **kw)
    return r.choices[0].message.content or ""


@pytest.mark.parametrize("stream", [False, True])
def test_same_prefix_lands_on_one_replica_at_low_load(fake_fleet: Any, router_server: Any,
                                                      stream: bool) -> None:
    fleet: Fleet = fake_fleet(4)
    srv, _ = router_server(router_settings(fleet.urls, routing={"rate_factor": 0,
                                                                "share_factor": 0}))
    c = client(srv.url)
    served = {ask(c, SYSTEM, f"question {i}", stream) for i in range(12)}
    assert len(served) == 1
    # different system prompts spread over the fleet instead of all going to one replica
    others = {ask(c, f"{SYSTEM} Team {i} handles region {i}-{i * 7}.", "hi", stream)
              for i in range(16)}
    assert len(others) >= 3


def test_new_conversations_of_one_prefix_spread_by_their_recent_rate(fake_fleet: Any,
                                                                     router_server: Any) -> None:
    """The bounded rate (routing.rate_factor 2 on first turns), on whatever the follow-ups bring
    (rate_min_follow_tokens 0): one system prompt's new conversations, one at a time, still use
    only a part of the fleet - each replica they use takes up to twice its fair share of them."""
    fleet: Fleet = fake_fleet(4)
    srv, _ = router_server(router_settings(fleet.urls, routing={"rate_min_follow_tokens": 0}))
    c = client(srv.url)
    served = [ask(c, SYSTEM, f"question {i}", False) for i in range(16)]
    assert 2 <= len(set(served)) <= 3, served
    assert max(served.count(n) for n in set(served)) <= 2 * 16 / 4 + 2


def test_single_turn_requests_of_one_prefix_stay_with_it(fake_fleet: Any,
                                                          router_server: Any) -> None:
    """By default the bounded rate spreads new conversations only while they bring follow-up
    work (routing.rate_min_follow_tokens): single-turn requests of one system prompt, one at a
    time, all go to the replica that holds it rather than copying it onto more caches."""
    fleet: Fleet = fake_fleet(4)
    srv, _ = router_server(router_settings(fleet.urls))
    c = client(srv.url)
    served = [ask(c, SYSTEM, f"question {i}", False) for i in range(16)]
    assert len(set(served)) == 1, served


def test_hot_prefix_spreads_while_conversations_stay(fake_fleet: Any,
                                                     router_server: Any) -> None:
    fleet: Fleet = fake_fleet(4)
    # cache_aware with its bounded-load floor at 0: the pure cap ceil(1.25 * (L + 1) / 4) on
    # this router's exact in-flight counts (no scrape lag); the conversations' histories are
    # what keeps them on their replica (the prefix index, written from each answered turn)
    srv, app = router_server(router_settings(fleet.urls, scrape={"enabled": False},
                                             routing={"cache_load_floor": 0}))
    c = client(srv.url, timeout=30)
    conversations, turns = 32, 4
    placed: dict[int, list[str]] = defaultdict(list)
    samples: list[list[int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            loads = [s.in_flight for s in app.replicas.states()]
            # steady state: (nearly) every conversation has a request open. Bounded loads caps
            # a replica at ceil(1.25 * 32 / 4) = 10 when placing; the mean is then >= 31/4
            if sum(loads) >= conversations - 1:
                samples.append(loads)
            time.sleep(0.01)

    def talk(conv: int) -> None:
        # unsynchronised conversations, like real users: staggered starts, varied answer times
        time.sleep(conv * 0.01)
        delay = str(0.2 + (conv % 7) * 0.03)
        history: list[Any] = [{"role": "system", "content": SYSTEM}]
        for turn in range(turns):
            # each turn resends the conversation so far, as chat clients do
            history.append({"role": "user", "content": f"user {conv} asks question {turn}"})
            r = c.chat.completions.create(model="fake-model", messages=history,
                                          extra_headers={"x-fake-delay": delay})
            answer = r.choices[0].message.content or ""
            placed[conv].append(answer)  # the fake answers with its name
            history.append({"role": "assistant", "content": answer})

    sampler = threading.Thread(target=sample)
    sampler.start()
    with ThreadPoolExecutor(conversations) as pool:
        list(pool.map(talk, range(conversations)))
    stop.set()
    sampler.join()

    assert len(samples) > 10
    ratios = [max(s) / statistics.mean(s) for s in samples]
    assert max(ratios) <= 1.3, max(ratios)
    assert min(len([x for x in s if x]) for s in samples) == 4  # every replica took a share
    # after the first turn placed it, a conversation keeps its replica
    kept = sum(len(set(p[1:])) == 1 for p in placed.values())
    assert kept >= 0.9 * conversations, dict(placed)


def test_client_disconnect_mid_stream_reaches_the_replica(fake_fleet: Any,
                                                          router_server: Any) -> None:
    fleet: Fleet = fake_fleet(1)
    srv, app = router_server(router_settings(fleet.urls))
    c = client(srv.url)
    stream = c.chat.completions.create(
        model="fake-model", messages=messages(SYSTEM, "long answer please"), stream=True,
        extra_headers={"x-fake-chunks": "50", "x-fake-chunk-delay": "0.1"})
    first = next(iter(stream))
    assert first.choices[0].delta.content == "r0"
    stream.close()
    fake = fleet.replicas[0]
    deadline = time.monotonic() + 5
    while fake.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.cancelled == 1
    r0 = app.replicas.get("r0")
    assert r0 is not None
    while r0.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r0.in_flight == 0
    assert ask(c, SYSTEM, "still works", True) == "r0"


def test_error_answers_in_openai_format(fake_fleet: Any, router_server: Any) -> None:
    fleet: Fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, proxy={"max_body_bytes": 2000},
                                           auth={"api_keys": ["sk-good"]}))
    with pytest.raises(openai.AuthenticationError) as auth_err:
        client(srv.url).chat.completions.create(model="fake-model",
                                                messages=messages(SYSTEM, "hi"))
    assert auth_err.value.status_code == 401
    good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-good", max_retries=0)
    with pytest.raises(openai.APIStatusError) as too_big:
        good.chat.completions.create(model="fake-model", messages=messages(SYSTEM, "x" * 3000))
    assert too_big.value.status_code == 413
    assert ask(good, SYSTEM, "fine", False) == "r0"


def test_killed_replica_costs_no_non_streamed_request(router_server: Any) -> None:
    fleet_mod = pytest.importorskip("loadtest.fleet")
    with fleet_mod.Fleet(replicas=3, speed=4.0) as sim:
        srv, app = router_server(router_settings(list(sim.urls), health={"interval": 0.5}))
        c = client(srv.url, timeout=30)
        results: list[int] = []
        errors: list[str] = []
        stop = threading.Event()

        def work(i: int) -> None:
            n = 0
            while not stop.is_set() and n < 200:
                n += 1
                try:
                    r = c.chat.completions.with_raw_response.create(
                        model="sim-model", max_tokens=8,
                        messages=messages(f"{SYSTEM} Desk {i % 6}.", f"q{n}"))
                    results.append(r.http_response.status_code)
                except openai.APIError as exc:
                    errors.append(repr(exc))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        sim.kill(1)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        metrics = httpx.get(srv.url + "/metrics").text
        assert errors == []
        assert len(results) > 20 and set(results) == {200}
        dead = app.replicas.get("r1")  # router_settings names replicas by position
        assert dead is not None and not dead.healthy
        assert "prefix_router_ejections_total" in metrics


def test_completions_conversations_spread_and_follow_their_history(fake_fleet: Any,
                                                                    router_server: Any) -> None:
    """Raw prompts sharing a long preamble: at low load each new conversation (mostly new
    text after the preamble) is placed by its own content, so they spread over the fleet, and
    every later turn - the previous prompt plus more - goes where its conversation started."""
    fleet: Fleet = fake_fleet(4)
    srv, _ = router_server(router_settings(fleet.urls))
    preamble = "You are a meticulous research assistant. Cite sources. " * 40   # ~2.2 kB
    http = httpx.Client(timeout=10)

    def served(prompt: str) -> str:
        r = http.post(srv.url + "/v1/completions",
                      json={"model": "fake-model", "prompt": prompt, "max_tokens": 4})
        assert r.status_code == 200, r.text
        return r.headers["x-prefix-router-replica"]

    # ~6.5 kB of new text each: the preamble is a quarter of the prompt, under
    # routing.match_threshold (0.3)
    prompts = {c: preamble + f"Conversation {c}: " + f"document {c} line. " * 350
               for c in range(12)}
    first = {c: served(p) for c, p in prompts.items()}
    assert len(set(first.values())) >= 3
    for turn in range(2):
        for c in prompts:
            prompts[c] += f" Turn {turn} of {c}: " + "a follow-up question. " * 70
            assert served(prompts[c]) == first[c], (c, turn)
    assert served(prompts[0]) == served(prompts[0])   # the same prompt, the same replica
