"""The one-cache ceiling: a hand-computed replay, and the replica's own counts on real requests;
the OPT bound (Belady's MIN with bypass): hand-computed cases and an exhaustive search over every
eviction choice on tiny sequences."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import httpx
import pytest

from loadtest.ceiling import Ceiling, fits, fleet_ceiling, opt_bound, replay
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


def _single(blocks: Sequence[int]) -> list[tuple[tuple[int, ...], int]]:
    """One 5-token prompt per block (one full 4-token block, always hit-eligible)."""
    return [((b,), 5) for b in blocks]


@pytest.mark.parametrize(("prompts", "num_blocks", "hit_blocks"), [
    # a b c a b c with room for 2: LRU hits nothing, MIN keeps a and b and skips c
    (_single([1, 2, 3, 1, 2, 3]), 2, 2),
    # room for all three: every second access hits
    (_single([1, 2, 3, 1, 2, 3]), 3, 3),
    # room for one: keep a (used soonest), skip b and c on their first access
    (_single([1, 2, 3, 1, 2, 3]), 1, 1),
    # no room at all, and an unbounded cache
    (_single([1, 2, 3, 1, 2, 3]), 0, 0),
    (_single([1, 2, 3, 1, 2, 3]), None, 3),
    # a b a c c a with room for 1: keep a, and c replaces it only while a is not used first
    (_single([1, 2, 1, 3, 3, 1]), 1, 2),
    # a block never used again is skipped, not cached over one that is: b's one access does
    # not evict a
    (_single([1, 2, 1]), 1, 1),
    # a prompt's blocks are accesses in order: the second A hits both of its blocks
    ([(A, 9), (A, 9)], 2, 2),
    # the non-eligible last block of an 8-token prompt is in the sequence: the longer prompt
    # after it hits (11, 12) on one replica, and the bound counts both
    ([(A, 8), ((11, 12, 13), 13)], None, 2),
])
def test_opt_bound_by_hand(prompts: list[tuple[tuple[int, ...], int]], num_blocks: int | None,
                           hit_blocks: int) -> None:
    got = opt_bound(prompts, num_blocks, 4)
    assert got.hit_tokens == 4 * hit_blocks
    assert got.query_tokens == sum(t for _h, t in prompts)
    assert got.requests == len(prompts) and got.num_blocks == num_blocks


def _best_hits(seq: Sequence[int], k: int) -> int:
    """Exhaustive: the most page hits of any cache of ``k`` pages over ``seq`` that loads a page
    only on its access (or skips it) and may evict any resident page to make room."""

    @cache
    def best(i: int, resident: frozenset[int]) -> int:
        if i == len(seq):
            return 0
        b = seq[i]
        if b in resident:
            return 1 + best(i + 1, resident)
        options = [best(i + 1, resident)]  # skip
        if len(resident) < k:
            options.append(best(i + 1, resident | {b}))
        else:
            options += [best(i + 1, (resident - {v}) | {b}) for v in resident]
        return max(options)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(40))
def test_opt_bound_is_the_optimum_of_every_eviction_choice(seed: int) -> None:
    # random sequences of 4 pages, 10 accesses, caches of 0-3 pages: MIN with bypass reaches
    # the exhaustive optimum, so it bounds every eviction policy and is tight
    rng = random.Random(seed)
    seq = [rng.randrange(4) for _ in range(10)]
    for k in range(4):
        assert opt_bound(_single(seq), k, 4).hit_tokens == 4 * _best_hits(seq, k), (seq, k)
    # a cache larger than the distinct pages is the unbounded one
    assert opt_bound(_single(seq), 8, 4).hit_tokens == opt_bound(_single(seq), None, 4).hit_tokens


def test_opt_bound_is_at_least_the_lru_ceiling() -> None:
    # the LRU ceiling is one replica of the same pool (`replay`), a router like any other
    rng = random.Random(7)
    seq = [rng.randrange(6) for _ in range(200)]
    for k in (1, 2, 4, 8, 16):
        assert opt_bound(_single(seq), k, 4).hit_tokens >= replay(_single(seq), k, 4).hit_tokens
