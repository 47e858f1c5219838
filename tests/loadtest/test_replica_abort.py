"""Abort on disconnect: a client that goes away stops its request and frees its blocks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtest.replica import Replica, ReplicaConfig
from tests.conftest import wait_for

HTTP = httpx.Client(timeout=30)


@pytest.fixture
def sim(threaded_server: Callable[..., Any]) -> Callable[..., tuple[str, Replica]]:
    def start(**options: Any) -> tuple[str, Replica]:
        replica = Replica(ReplicaConfig(**options))
        return threaded_server(replica).url, replica

    return start


def stats(url: str) -> dict[str, Any]:
    return dict(HTTP.get(url + "/admin/stats").json())


def test_closing_a_stream_aborts_it_and_frees_its_blocks(sim: Callable[..., Any]) -> None:
    url, replica = sim(speed=5.0)
    with httpx.Client(timeout=30) as own, own.stream("POST", url + "/v1/completions", json={
            "prompt": list(range(400)), "max_tokens": 5000, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        assert stats(url)["running"] != []
        assert replica.engine.kv_usage > 0
    wait_for(lambda: stats(url)["aborts"] == 1, "the abort")
    s = stats(url)
    assert s["running"] == [] and s["in_flight"] == 0
    assert replica.engine.kv_usage == 0.0
    assert replica.engine.stats.generation_tokens < 5000   # generation stopped early
    assert "sim:aborts_total{model_name=\"sim-model\"} 1.0" in HTTP.get(url + "/metrics").text


def test_non_streamed_client_timeout_aborts(sim: Callable[..., Any]) -> None:
    url, replica = sim(speed=5.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json={"prompt": list(range(100)), "max_tokens": 5000},
                   timeout=0.5)
    wait_for(lambda: stats(url)["aborts"] == 1, "the abort")
    assert stats(url)["running"] == [] and replica.engine.kv_usage == 0.0


def test_waiting_request_that_disconnects_leaves_the_queue(sim: Callable[..., Any]) -> None:
    url, replica = sim(speed=5.0, max_num_seqs=1)
    done: dict[str, int] = {}

    def first() -> None:
        r = httpx.post(url + "/v1/completions", json={"prompt": list(range(50)),
                                                      "max_tokens": 400}, timeout=30)
        done["status"] = r.status_code

    t = threading.Thread(target=first)
    t.start()
    wait_for(lambda: stats(url)["running"] != [], "the first request to run")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json={"prompt": list(range(60)), "max_tokens": 5},
                   timeout=0.3)
    wait_for(lambda: stats(url)["aborts"] == 1, "the waiting request's abort")
    assert stats(url)["waiting"] == []
    t.join(timeout=30)
    assert done["status"] == 200
    assert replica.engine.stats.finished == 1
