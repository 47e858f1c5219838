"""Precise routing on real vLLM: the router subscribes to the stage's replicas' KV events,
tokenises requests with the model's own files, and predicts the cached tokens vLLM reports.

A conversation of several turns (its unique marker opens the system prompt, so nothing of it is
cached before) is sent through the router, one request at a time; before each request the test
waits until the router applied every batch the serving replica published (its replay endpoint
has nothing past the router's last sequence number), so the index is the replica's at routing
time. Every prediction must then equal vLLM's ``cached_tokens``; the last turn's prompt is then
sent once more (all but its last block cached). The router's /metrics must show the index fed by
the events (``prefix_router_kv_index_blocks`` > 0 for the serving replica) and equal predicted and
reported totals (``prefix_router_predicted_cached_tokens_total`` /
``prefix_router_reported_cached_tokens_total``). No timing is asserted; every wait is bounded.

Chat requests only. The router encodes a completions prompt as it does a rendered chat prompt,
without the tokenizer's special tokens, while vLLM's completions path adds them: for a model whose
tokenizer.json has a BOS post-processor (real Llama checkpoints) predictions for completions miss
(docs/kv-events.md). The tiny test model has none, so it would not show here either way.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.vllm_fleet import VllmFleet
from router.app import create_app
from router.settings import Settings
from router.usage import Usage
from tests.conftest import ThreadedServer, wait_for
from tests.loadtest.test_replica_kv_events import Subscriber

from ._prompts import prose

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

MODEL = "tiny-llama"


def settings_for(fleet: VllmFleet) -> Settings:
    model = fleet.env.model_dir
    template = model / "chat_template.jinja"
    return Settings.from_dict({
        "replicas": [{"name": n, "url": u, "kv_events_endpoint": e, "kv_replay_endpoint": r}
                     for n, u, e, r in zip(fleet.names, fleet.urls, fleet.kv_endpoints,
                                           fleet.kv_replay_endpoints, strict=True)],
        "routing": {"policy": "cache_aware", "tokenizer": str(model / "tokenizer.json"),
                    "chat_template": str(template) if template.is_file() else None,
                    "kv_events": {"enabled": True, "topic": "kv"}},
        "health": {"interval": 0.5, "timeout": 2.0},
        "scrape": {"interval": 0.2},
        "proxy": {"first_byte_timeout": 120.0},
        "logging": {"access_log": False}})


def router_sample(text: str, name: str, replica: str) -> float:
    """The value of sample ``name`` labelled ``replica`` in Prometheus text (0 when absent)."""
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and s.labels.get("replica") == replica)


def test_router_predicts_vllms_cached_tokens_from_its_events(fleet: VllmFleet,
                                                              unique: str) -> None:
    app = create_app(settings_for(fleet))
    rows: list[tuple[str, int, int | None]] = []
    inner = app.metrics.cached_tokens

    def hook(replica: str, predicted: int, usage: Usage | None) -> None:
        rows.append((replica, predicted, usage.cached_tokens if usage else None))
        inner(replica, predicted, usage)

    app.metrics.cached_tokens = hook  # type: ignore[method-assign]
    kv = app.kv
    assert kv is not None
    subs = {n: Subscriber(e, r) for n, e, r in zip(fleet.names, fleet.kv_endpoints,
                                                   fleet.kv_replay_endpoints, strict=True)}

    def caught_up(name: str) -> bool:
        last = kv.subscribers.feeds[name].last
        return last is not None and not subs[name].replay(last + 1)

    try:
        with ThreadedServer(app) as server:
            wait_for(lambda: all(kv.precise.live(n) for n in fleet.names), "streams live",
                     tries=1500)
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": unique + " " + prose(f"{unique}-router-sys", 200)}]
            with httpx.Client(base_url=server.url, timeout=120) as client:
                for turn in range(6):
                    messages.append({"role": "user",
                                     "content": prose(f"{unique}-router-q{turn}", 30)})
                    r = client.post("/v1/chat/completions", json={
                        "model": MODEL, "messages": messages, "max_tokens": 8})
                    assert r.status_code == 200, r.text
                    messages.append({"role": "assistant",
                                     "content": r.json()["choices"][0]["message"]["content"]})
                    replica: str = r.headers["x-prefix-router-replica"]
                    wait_for(lambda n=turn + 1: len(rows) == n, "the request's row", tries=500)
                    wait_for(functools.partial(caught_up, replica),
                             f"{replica}'s events applied", tries=500)
                # the last turn's prompt once more: the same blocks, now all known from events
                r = client.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": messages[:-1], "max_tokens": 8})
                assert r.status_code == 200, r.text
                replica = r.headers["x-prefix-router-replica"]
                wait_for(lambda: len(rows) == 7, "the request's row", tries=500)
                wait_for(functools.partial(caught_up, replica),
                         f"{replica}'s events applied", tries=500)
                metrics = client.get("/metrics").text
    finally:
        for sub in subs.values():
            sub.close()
    served = sorted({name for name, _, _ in rows})
    totals = {name: (router_sample(metrics, "prefix_router_kv_index_blocks", name),
                     router_sample(metrics, "prefix_router_predicted_cached_tokens_total", name),
                     router_sample(metrics, "prefix_router_reported_cached_tokens_total", name))
              for name in served}
    print(f"\nprecise routing on vLLM: (replica, predicted, reported cached tokens) {rows}")
    print(f"router /metrics per serving replica: (kv_index_blocks, predicted total, "
          f"reported total) {totals}")
    assert len(rows) == 7 and all(reported is not None for _, _, reported in rows)
    assert [p for _, p, _ in rows] == [r for _, _, r in rows]
    assert sum(p for _, p, _ in rows[1:]) > 0  # later turns hit their history
    assert rows[-1][1] > 0 and rows[-1][1] == rows[-1][2]  # the repeated prompt
    for name, (blocks, predicted, reported) in totals.items():
        assert blocks > 0, f"{name}: no events reached the precise index"
        assert predicted == reported == sum(p for n, p, _ in rows if n == name)
