"""The timing model seen from a client: cache hits cut TTFT, batches slow decoding down."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.scrape import parse

HTTP = httpx.Client(timeout=60)


def ttft(url: str, prompt: list[int]) -> float:
    """Seconds from sending a streamed completion to its first content chunk."""
    t0 = time.perf_counter()
    with HTTP.stream("POST", url + "/v1/completions", json={
            "prompt": prompt, "max_tokens": 2, "stream": True}) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                first = time.perf_counter() - t0
                break
        for _ in lines:
            pass
    return first


def test_cache_hit_cuts_ttft_of_a_2k_prompt(threaded_server: Callable[..., Any]) -> None:
    url = threaded_server(Replica(ReplicaConfig())).url   # real-time defaults
    prompt = list(range(2048))
    ttft(url, list(range(100_000, 100_016)))   # warm up the connection
    uncached = ttft(url, prompt)
    cached = ttft(url, prompt)
    # model: 214.8 ms vs 11.6 ms; a wide margin for HTTP noise on a loaded machine
    assert uncached > 3 * cached
    m = parse(HTTP.get(url + "/metrics").text)
    assert m["vllm:prefix_cache_hits_total"] == 2032


def test_decode_slows_down_as_the_batch_grows(threaded_server: Callable[..., Any]) -> None:
    # A large per-sequence cost makes the batch effect dominate the fixed step cost.
    replica = Replica(ReplicaConfig(speed=2.0, step_ms=1.0, decode_us_per_seq=4000.0))
    url = threaded_server(replica).url
    body = {"prompt": list(range(20)), "max_tokens": 20}

    def one() -> float:
        t0 = time.perf_counter()
        HTTP.post(url + "/v1/completions", json=body).raise_for_status()
        return time.perf_counter() - t0

    alone = one()
    streams = []
    with httpx.Client(timeout=60) as other:
        for i in range(8):   # eight long requests keep the batch full while we measure
            streams.append(other.send(other.build_request("POST", url + "/v1/completions", json={
                "prompt": [i] * 20, "max_tokens": 400, "stream": True}), stream=True))
        readers = [s.iter_lines() for s in streams]   # keep them: a dropped reader closes its stream
        for lines in readers:
            next(lines)
        assert len(replica.engine.running) == 8
        crowded = one()
        for s in streams:
            s.close()
    assert crowded > 2 * alone   # model: 7.4x (1 + 9 * 4 ms vs 1 + 4 ms per step)
