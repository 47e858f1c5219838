"""The one-cache ceiling: a hand-computed replay, and the replica's own counts on real requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtest.ceiling import Ceiling, fits, fleet_ceiling, replay
from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.scrape import parse
from loadtest.workloads import WorkloadSpec, generate

A, B = (11, 12), (21, 22)  # two prompts of two full 4-token blocks each (plus a partial one)


def test_replay_by_hand() -> None:
    # a 3-block cache, 4-token blocks; every prompt is 9 tokens = 2 full blocks + 1 token
    prompts = [(A, 9), (A, 9), (B, 9), (A, 9)]
    got = replay(prompts, 3, 4)
    # cold miss; 2 blocks hit (8 tokens); B takes all 3 blocks, evicting A; A misses again
    assert got == Ceiling(requests=4, hit_tokens=8, query_tokens=36, num_blocks=3, block_size=4)
    assert got.hit_rate == pytest.approx(8 / 36)
    # twice the size keeps both: the last A hits too
    assert replay(prompts, 6, 4).hit_tokens == 16
    assert replay(prompts, None, 4).hit_tokens == 16  # unbounded
    # the last prompt token is always computed: 8 tokens = 2 full blocks hit only the first
    assert replay([(A, 9), (A, 8)], 6, 4).hit_tokens == 4
    # a partial block is never cached: same first block, different second -> one block hit
    assert replay([(A, 9), ((11, 99), 9)], 6, 4).hit_tokens == 4
    # what one replica admits: prompt + max_tokens within its pool
    assert fits(9, 3, 3, 4) and not fits(9, 4, 3, 4) and fits(10**6, 1, None, 4)


@pytest.mark.parametrize("name", ["rag", "agent", "multi-turn"])
def test_ceiling_of_one_replica_is_what_that_replica_counts(
        name: str, threaded_server: Callable[..., Any]) -> None:
    spec = WorkloadSpec(name, requests=24, seed=3, prompts=2, min_prompt_tokens=100,
                        max_prompt_tokens=300, min_history_tokens=1500, max_history_tokens=3000,
                        stream=False)
    reqs = generate(spec)
    srv = threaded_server(Replica(ReplicaConfig(instant=True, kv_blocks=1 << 14)))
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for r in reqs:  # one at a time, in order: the ceiling's assumptions hold exactly
            client.post(r.path, content=r.json_bytes(),
                        headers={"content-type": "application/json"}).raise_for_status()
        metrics = parse(client.get("/metrics").text)
    got = fleet_ceiling(reqs, replicas=1, kv_blocks=1 << 14)
    assert got.requests == 24
    assert (got.hit_tokens, got.query_tokens) == (metrics["vllm:prefix_cache_hits_total"],
                                                  metrics["vllm:prefix_cache_queries_total"])
    assert 0 < got.hit_rate < 1
    # four replicas' worth of the same total is the same single cache
    assert fleet_ceiling(reqs, replicas=4, kv_blocks=1 << 12).hit_tokens == got.hit_tokens
    # requests one replica refuses (prompt + max_tokens over its pool) are not replayed
    longest = max(len(r.json_bytes()) for r in reqs)  # > its tokens (~4 characters each)
    assert fleet_ceiling(reqs, replicas=64, kv_blocks=longest // 16 // 8).requests < 24
