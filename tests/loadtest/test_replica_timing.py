"""The timing model seen from a client: cache hits cut TTFT, batches slow decoding down.

Wall-clock figures are asserted only as lower bounds the model sets (a step sleeps at least its
modelled time, so load can only add to them); what a fast path costs is the model's arithmetic,
checked exactly in `test_model_arithmetic`, not a stopwatch that a loaded machine can stretch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.scrape import parse
from loadtest.replica.timing import TimingModel

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
    ttft(url, prompt)
    model = TimingModel()
    # the uncached request paid its whole prefill (2,048 tokens: 214.8 ms) ...
    assert uncached >= model.step_seconds(2048, 0)
    # ... the cached one was scheduled with one block (16 tokens: 11.6 ms in the model)
    m = parse(HTTP.get(url + "/metrics").text)
    assert m["vllm:prefix_cache_hits_total"] == 2032   # 2,048 - 16: only one block computed


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
    # 19 decode steps beside 8 running streams (1 + 9 * 4 ms each at speed 2) at least; alone
    # the model gives 1 + 4 ms per step, 7.4x less (test_model_arithmetic)
    assert crowded >= 19 * replica.engine.timing.step_seconds(0, 9)
    assert alone > 0


def test_model_arithmetic() -> None:
    t = TimingModel()
    assert t.step_seconds(2048, 0) == pytest.approx(0.2148)   # uncached 2k-token prefill
    assert t.step_seconds(16, 0) == pytest.approx(0.0116)     # fully cached: one block
    batch = TimingModel(speed=2.0, step_ms=1.0, decode_us_per_seq=4000.0)
    assert batch.step_seconds(0, 9) / batch.step_seconds(0, 1) == pytest.approx(7.4)
    assert t.step_seconds(300, 1, slow=20.0) == pytest.approx(20 * t.step_seconds(300, 1))
