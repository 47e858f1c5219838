"""Precise routing end to end: simulated replicas publishing real KV events over ZMQ, the router
subscribed, real HTTP on loopback.

After 2,000 mixed requests (multi-turn chats under shared system prompts, completions) against
replicas whose caches are far smaller than the traffic's prefixes, so that evictions happen all
the time, the router's index for each replica must equal the engine's set of cached blocks, and
the cached tokens it predicted for each request must equal what the replica reported (issue 21:
in 99 %+ of requests, and everywhere within one block).

One race is inherent, and the test measures around it rather than loosening the bound: a
replica publishes a step's events on its publisher thread (as vLLM does) and answers on another
channel, so a response can reach the router before the events of the step that produced it. A
request the router routes in that window sees the index one batch behind: the batch may evict a
block of its prefix (over-prediction, by as many blocks as follow the evicted one) or store the
block the previous turn's decode filled (under-prediction by one block). Every request is
classified from the replica's own batch timestamps (its replay buffer, after the run): *raced*
when the served replica had stamped a batch the router had not applied when it decided. The 99 %
holds over all requests; "within one block" over every request that did not race.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import zmq.asyncio

from loadtest.fleet import Fleet
from router.app import RouterApp, create_app
from router.kv_events.replay import fetch
from router.kv_events.wire import decode_batch
from router.settings import Settings
from router.usage import Usage
from tests.conftest import ThreadedServer, wait_for

BS = 16
KV_BLOCKS = 160  # 2,560 tokens per replica: a few conversations' worth
# the replay buffer holds every batch of a run (about 13 per request), for `stamps`
CFG = json.dumps({"enable_kv_cache_events": True, "topic": "kv", "buffer_steps": 60_000,
                  "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"})
WORDS = ("cache block prefix replica router token event engine prompt batch stream "
         "queue evict shard model adapter").split()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(replicas=3, instant=True, block_size=BS, kv_blocks=KV_BLOCKS,
               kv_events_config=CFG) as f:
        yield f


def settings_for(fleet: Fleet, **routing: Any) -> Settings:
    replicas = [{"name": n, "url": u, "kv_events_endpoint": e, "kv_replay_endpoint": r}
                for n, u, e, r in zip(fleet.names, fleet.urls, fleet.kv_endpoints,
                                      fleet.kv_replay_endpoints, strict=True)]
    return Settings.from_dict({
        "replicas": replicas,
        "routing": {"policy": "cache_aware", "kv_events": {"enabled": True, "topic": "kv"},
                    **routing},
        "health": {"interval": 0.2, "timeout": 0.5, "readmit_backoff": 0.2},
        "scrape": {"interval": 0.2}, "logging": {"access_log": False}})


class Recorded:
    """Every served request's (replica, predicted, reported) cached tokens, from the app's
    own metrics hook."""

    def __init__(self, app: RouterApp) -> None:
        self.rows: list[tuple[str, int, int | None, int | None]] = []
        inner = app.metrics.cached_tokens

        def hook(replica: str, predicted: int, usage: Usage | None) -> None:
            self.rows.append((replica, predicted, usage and usage.cached_tokens,
                              usage and usage.prompt_tokens))
            inner(replica, predicted, usage)

        app.metrics.cached_tokens = hook  # type: ignore[method-assign]


class Decisions:
    """Per routed request: the wall-clock time of the decision and, per replica, the sequence
    number of the last batch the router had applied (after its catch-up, right before the
    index is matched), from the router's exact-keys hook."""

    def __init__(self, app: RouterApp) -> None:
        self.rows: list[tuple[float, dict[str, int | None]]] = []
        inner = app.router.exact
        assert inner is not None
        feeds = app.kv.subscribers.feeds  # type: ignore[union-attr]

        def exact(path: str, body: Any, pool: Any) -> Any:
            found = inner(path, body, pool)
            self.rows.append((time.time(), {n: f.last for n, f in feeds.items()}))
            return found

        app.router.exact = exact


def stamps(fleet: Fleet, i: int, start: int) -> dict[int, float]:
    """seq -> timestamp of every batch replica ``i`` published from ``start`` on (its replay
    buffer: the replica's own record of when each step's events were made)."""

    async def get() -> list[tuple[int, bytes]]:
        ctx = zmq.asyncio.Context()
        try:
            endpoint = fleet.kv_replay_endpoints[i]
            assert endpoint is not None
            return await fetch(ctx, endpoint, start, 5.0)
        finally:
            ctx.destroy(linger=0)

    got = asyncio.run(get())
    assert got and got[0][0] == start, "the replay buffer no longer holds the whole run"
    return {seq: decode_batch(payload).ts for seq, payload in got}


def kv_blocks(fleet: Fleet, i: int) -> set[int]:
    with urllib.request.urlopen(fleet.admin_urls[i] + "/admin/kv_blocks", timeout=5) as r:
        return set(json.loads(r.read())["hashes"])


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def traffic(rng: random.Random, n: int) -> Iterator[tuple[str, dict[str, Any], int]]:
    """(path, body, conversation) of ``n`` mixed requests; the caller appends replies."""
    systems = [text(rng, 150) for _ in range(6)]
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:
            yield "/v1/completions", {"prompt": systems[rng.randrange(6)] + text(rng, 20),
                                      "max_tokens": 8}, -1
        else:
            yield "/v1/chat/completions", {"max_tokens": 12}, rng.randrange(40)


def run_traffic(url: str, model: str, n: int, seed: int = 7,
                after: Callable[[str], None] | None = None) -> None:
    rng = random.Random(seed)
    systems = [text(rng, 150) for _ in range(6)]
    conversations: dict[int, list[dict[str, str]]] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for path, body, conv in traffic(rng, n):
            body["model"] = model
            if conv >= 0:
                history = conversations.get(conv)
                if history is None or len(history) > 12:
                    history = conversations[conv] = [
                        {"role": "system", "content": systems[conv % 6]}]
                history.append({"role": "user", "content": text(rng, rng.randrange(5, 60))})
                body["messages"] = list(history)
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            if after is not None:
                after(r.headers["x-prefix-router-replica"])
            if conv >= 0:
                history.append({"role": "assistant",
                                "content": r.json()["choices"][0]["message"]["content"]})


def caught_up(app: RouterApp, fleet: Fleet) -> Callable[[str], None]:
    """After a response: wait until the router applied every batch its replica published."""
    index = {n: i for i, n in enumerate(fleet.names)}

    def wait(name: str) -> None:
        feed = app.kv.subscribers.feeds[name]  # type: ignore[union-attr]

        def done() -> bool:
            kv = fleet.stats(index[name])["kv_events"]
            return kv["unsent"] == 0 and feed.last == kv["last_seq"]

        wait_for(done, f"{name}'s events applied")

    return wait


@pytest.mark.parametrize("synced", [False, True])
def test_index_equals_engine_and_prediction_equals_reported(fleet: Fleet, synced: bool) -> None:
    """Requests back to back, as one client sends them (no request is in flight while another
    is routed, so nothing evicts between a decision and its prefill); ``synced``: each one sent
    once the router applied every batch the replica published for the previous one (no request
    can race, which the classification must confirm)."""
    app = create_app(settings_for(fleet))
    recorded = Recorded(app)
    decisions = Decisions(app)
    srv = ThreadedServer(app).start()
    try:
        feeds = app.kv.subscribers.feeds  # type: ignore[union-attr]
        wait_for(lambda: all(app.kv.precise.live(n) for n in fleet.names),  # type: ignore[union-attr]
                 "every replica's stream live")
        start = {n: fleet.stats(i)["kv_events"]["published"] for i, n in enumerate(fleet.names)}
        run_traffic(srv.url, fleet.models[0][0], 2000, seed=7 + synced,
                    after=caught_up(app, fleet) if synced else None)
        precise = app.kv.precise  # type: ignore[union-attr]
        for i, name in enumerate(fleet.names):
            wait_for(lambda i=i, name=name: precise.engine_hashes(name) == kv_blocks(fleet, i),
                     f"{name}'s index to equal its engine's cached blocks")
            assert len(precise.engine_hashes(name)) > KV_BLOCKS // 2
            assert feeds[name].last is not None
        metrics = app.metrics.registry
        evicted = sum(metrics.get_sample_value("prefix_router_kv_events_total",
                                               {"replica": n, "type": "BlockRemoved"}) or 0
                      for n in fleet.names)
        assert evicted > 1000, "the caches were too large for evictions to matter"
        ts = {n: stamps(fleet, i, start[n]) for i, n in enumerate(fleet.names)}
        rows = [r for r in recorded.rows if r[2] is not None]
        assert len(rows) == 2000 and len(decisions.rows) == 2000
        assert sum(reported for _, _, reported, _ in rows) > 0
        exact = raced = 0
        off: list[str] = []  # requests that did not race yet were more than a block off
        for k, ((replica, predicted, reported, prompt), (when, applied)) in enumerate(
                zip(rows, decisions.rows, strict=True)):
            assert reported is not None
            last = applied[replica]
            pending = ts[replica].get(start[replica] if last is None else last + 1)
            behind = pending is not None and pending <= when
            raced += behind
            exact += predicted == reported
            if abs(predicted - reported) > BS and not behind:
                off.append(f"#{k} on {replica}: predicted {predicted}, reported {reported} "
                           f"of {prompt}")
        summary = (f"{exact} of {len(rows)} predictions exact, {raced} routed while their "
                   f"replica's last batch was in transit")
        assert exact >= 0.99 * len(rows), summary
        assert not off, f"{summary}; more than one block off without a race: {off}"
        if synced:
            assert raced == 0, summary
    finally:
        srv.stop()


@pytest.mark.parametrize("routers", [2, 4])
def test_several_routers_score_a_request_alike(fleet: Fleet, routers: int) -> None:
    from router.chunks import request_chunks

    apps = [create_app(settings_for(fleet)) for _ in range(routers)]
    servers = [ThreadedServer(app).start() for app in apps]
    try:
        for app in apps:
            wait_for(lambda app=app: all(app.kv.precise.live(n) for n in fleet.names),
                     "every replica's stream live")
        model = fleet.models[0][0]
        for i, srv in enumerate(servers):  # each router sees only its share of the traffic
            run_traffic(srv.url, model, 150, seed=100 + i)
        for app in apps:
            for i, name in enumerate(fleet.names):
                wait_for(lambda app=app, i=i, name=name:
                         app.kv.precise.engine_hashes(name) == kv_blocks(fleet, i),
                         f"{name}'s index to catch up")
        rng = random.Random(3)
        probes = 0
        for _ in range(40):
            body = {"model": model, "messages": [
                {"role": "system", "content": text(rng, 150)},
                {"role": "user", "content": text(rng, 20)}]}
            scores = []
            for app in apps:
                chunks = request_chunks("/v1/chat/completions", body, 1024, 4.0)
                exact = app.kv.exact("/v1/chat/completions", body, None)  # type: ignore[union-attr]
                assert exact is not None
                scores.append(app.router.index.match(chunks._replace(exact=exact)))
            assert all(s == scores[0] for s in scores), scores
            probes += bool(scores[0])
        # and the prompts the routers actually served, replayed as probes
        systems = []
        for i in range(routers):
            rng = random.Random(100 + i)
            systems += [text(rng, 150) for _ in range(6)]
        for system in systems:
            body = {"model": model, "messages": [{"role": "system", "content": system},
                                                 {"role": "user", "content": "x"}]}
            scores = [app.router.index.match(request_chunks(
                "/v1/chat/completions", body, 1024, 4.0)._replace(
                exact=app.kv.exact("/v1/chat/completions", body, None)))  # type: ignore[union-attr]
                for app in apps]
            assert all(s == scores[0] for s in scores), scores
            probes += bool(scores[0])
        assert probes > 0, "no probe matched anything: the comparison proved nothing"
    finally:
        for srv in servers:
            srv.stop()
