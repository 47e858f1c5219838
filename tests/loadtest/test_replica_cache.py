"""vLLM's prefix-cache block math through the replica's HTTP API, read back from /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.scrape import parse

HTTP = httpx.Client(timeout=30)


class Sim:
    def __init__(self, url: str) -> None:
        self.url = url

    def complete(self, ids: list[int], max_tokens: int = 1) -> int:
        """Send a token-id prompt; the number of cached prompt tokens vLLM would report."""
        r = HTTP.post(self.url + "/v1/completions", json={"prompt": ids, "max_tokens": max_tokens})
        r.raise_for_status()
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    def metrics(self) -> dict[str, float]:
        return parse(HTTP.get(self.url + "/metrics").text)


@pytest.fixture
def sim(threaded_server: Callable[..., Any]) -> Iterator[Callable[..., Sim]]:
    def start(**options: Any) -> Sim:
        options.setdefault("speed", 100.0)
        return Sim(threaded_server(Replica(ReplicaConfig(**options))).url)

    yield start


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_partial_last_block_is_never_cached(sim: Callable[..., Sim]) -> None:
    s = sim()
    assert s.complete(ids(0, 15)) == 0
    assert s.complete(ids(0, 15)) == 0          # 15 tokens: no full block at all
    assert s.complete(ids(0, 20)) == 0          # block 0 was never full before
    assert s.complete(ids(0, 20)) == 16         # now it is; the 4-token tail is not
    assert s.complete(ids(0, 16) + ids(900, 10)) == 16   # different tail, same first block


def test_same_block_after_a_different_prefix_is_a_miss(sim: Callable[..., Sim]) -> None:
    s = sim()
    shared = ids(5000, 32)
    assert s.complete(ids(0, 16) + shared + [1]) == 0
    assert s.complete(ids(100, 16) + shared + [1]) == 0      # chained hashes differ
    assert s.complete(ids(0, 16) + shared + [2]) == 48


def test_hits_and_queries_are_counted_in_tokens(sim: Callable[..., Sim]) -> None:
    s = sim()
    prompts = [ids(0, 40), ids(0, 40), ids(0, 70), ids(300, 33)]
    cached = [s.complete(p, max_tokens=2) for p in prompts]
    assert cached == [0, 32, 32, 0]
    m = s.metrics()
    assert m["vllm:prefix_cache_queries_total"] == sum(map(len, prompts)) == 183
    assert m["vllm:prefix_cache_hits_total"] == 64
    assert m["vllm:prompt_tokens_total"] == 183
    assert m["vllm:generation_tokens_total"] == 8
    assert m["sim:requests_total"] == 4


def test_chat_prompts_share_the_rendered_system_prefix(sim: Callable[..., Sim]) -> None:
    s = sim()
    system = {"role": "system", "content": "You route requests to warm caches. " * 30}
    tokens = []
    for question in ("What is a block?", "Why chain hashes?"):
        r = HTTP.post(s.url + "/v1/chat/completions", json={
            "messages": [system, {"role": "user", "content": question}], "max_tokens": 1}).json()
        tokens.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert tokens[0] == 0 and tokens[1] >= 16 * 10   # the long system turn is reused


def test_lru_eviction_with_a_small_pool(sim: Callable[..., Sim]) -> None:
    s = sim(kv_blocks=12)
    a, b = ids(0, 80), ids(1000, 80)            # 5 full blocks each (+1 partial)
    assert s.complete(a) == 0
    assert s.complete(a) == 64
    assert s.complete(b) == 0                    # fits next to a's cached blocks
    assert s.complete(ids(2000, 80)) == 0        # evicts the least recently used blocks (a's)
    assert s.complete(b) == 64                   # b was used more recently: still cached
    assert s.complete(a) < 64                    # a lost blocks to eviction
    assert s.metrics()["vllm:kv_cache_usage_perc"] == 0.0   # nothing running: nothing pinned


def test_kv_usage_reflects_pinned_blocks_of_a_running_request(sim: Callable[..., Sim]) -> None:
    s = sim(kv_blocks=100, speed=20.0)
    with HTTP.stream("POST", s.url + "/v1/completions", json={
            "prompt": ids(0, 320), "max_tokens": 200, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        m = s.metrics()
        assert m["vllm:num_requests_running"] == 1
        assert 0.2 <= m["vllm:kv_cache_usage_perc"] <= 1.0
        for _ in lines:
            pass
    assert s.metrics()["vllm:kv_cache_usage_perc"] == 0.0


REQUIRED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
    "sim:aborts": "counter",
    "sim:requests": "counter",
}


def test_metric_names_types_and_labels(sim: Callable[..., Sim]) -> None:
    s = sim(model="m7", block_size=32)
    s.complete(ids(0, 40), max_tokens=2)
    text = HTTP.get(s.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in REQUIRED.items():
        assert families[name].type == kind, name
        assert all(sample.labels.get("model_name") == "m7" for sample in families[name].samples)
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "sim:aborts_total", "sim:requests_total",
                 "vllm:time_to_first_token_seconds_bucket"):
        assert f"\n{name}{{" in text, name
    info = families["vllm:cache_config_info"].samples[0]
    assert info.labels["block_size"] == "32"
    m = parse(text)
    assert m["vllm:time_to_first_token_seconds_count"] == 1
    assert m["vllm:e2e_request_latency_seconds_count"] == 1


def test_replicas_in_one_process_have_separate_registries(sim: Callable[..., Sim]) -> None:
    a, b = sim(), sim()
    a.complete(ids(0, 20))
    assert a.metrics()["sim:requests_total"] == 1
    assert b.metrics()["sim:requests_total"] == 0


def test_preemption_when_decode_runs_out_of_blocks_is_counted(sim: Callable[..., Sim]) -> None:
    """Two requests of 8 blocks each (60 prompt + 60 generated tokens) on 12 blocks: once both
    run, decode runs out of blocks. Steps are slowed (fault `slow`: ~0.25 s a step) until both
    are in the engine, so the first cannot finish alone however late the second thread runs;
    then the engine goes at full speed."""
    import threading

    s = sim(kv_blocks=12, speed=200.0)
    HTTP.post(s.url + "/admin/fault", json={"slow": 5000.0}).raise_for_status()
    threads = [threading.Thread(target=s.complete, args=(ids(k * 1000, 60), 60)) for k in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while (m := s.metrics())["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] < 2:
        assert time.monotonic() < deadline, f"both requests never reached the engine: {m}"
        time.sleep(0.02)
    HTTP.post(s.url + "/admin/fault", json={}).raise_for_status()
    for t in threads:
        t.join(timeout=60)
    m = s.metrics()
    assert m["vllm:num_preemptions_total"] >= 1     # 2 x 8 blocks needed, 12 available
    assert m["vllm:generation_tokens_total"] >= 120
    assert m["vllm:request_success_total"] == 2


def test_next_turn_of_a_conversation_hits_on_the_previous_reply(sim: Callable[..., Sim]) -> None:
    s = sim()
    msgs = [{"role": "system", "content": "You are terse. " * 10},
            {"role": "user", "content": "first question here"}]
    first = HTTP.post(s.url + "/v1/chat/completions",
                      json={"messages": msgs, "max_tokens": 40}).json()
    msgs += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "second"}]
    second = HTTP.post(s.url + "/v1/chat/completions",
                       json={"messages": msgs, "max_tokens": 4}).json()
    u = first["usage"]
    # everything turn one computed (prompt + reply but its last token), in full blocks
    computed = u["prompt_tokens"] + u["completion_tokens"] - 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == computed // 16 * 16
    assert computed // 16 * 16 > u["prompt_tokens"]   # the hit reaches into the reply
