"""`loadtest.bench_vllm` at toy scale against the real two-replica fleet.

The workload is built so that prefix routing must hit at least as often as round-robin: 12
shared-prefix requests over 3 system prompts, sent one at a time (closed loop, concurrency 1),
each setup starting from emptied caches that hold every prompt with room to spare (16k tokens).
One at a time, the bounded-load cap never makes the prefix policy spill, so every prompt is
prefilled once on its home replica; round-robin prefills it on each replica it lands on. With no
eviction, each request's cached prefix under prefix routing contains the one it would find under
round-robin, so the fleet's hit tokens can only be greater or equal.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadtest.bench_vllm import BenchConfig, bench, render
from loadtest.vllm_fleet import VllmEnv, VllmFleet

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

SETUPS = ("router-prefix", "router-round_robin")


def test_bench_vllm_tiny_run(fleet: VllmFleet, vllm_env: VllmEnv, tmp_path: Path) -> None:
    cfg = BenchConfig(requests=12, rate=None, concurrency=1, prompts=3, max_tokens=4,
                      policies=("prefix", "round_robin"))
    data = bench(fleet, cfg, tmp_path, tokenizer=str(vllm_env.model_dir))
    prefix, rr = (data["setups"][name] for name in SETUPS)
    print(f"\nbench_vllm tiny: prefix hit {prefix['hit_rate']:.3f} ({prefix['hit_tokens']:.0f} "
          f"of {prefix['query_tokens']:.0f}), round-robin {rr['hit_rate']:.3f} "
          f"({rr['hit_tokens']:.0f}); TTFT p50 {prefix['ttft']['p50'] * 1000:.0f} vs "
          f"{rr['ttft']['p50'] * 1000:.0f} ms")

    assert data["failed"] == {}
    assert tuple(data["setups"]) == SETUPS
    for name in SETUPS:
        s = data["setups"][name]
        assert (s["ok"], s["error_count"], s["errors"]) == (12, 0, {}), s["errors"]
        for stat in ("ttft", "e2e"):
            assert {"p50", "p90", "p99", "mean", "max"} <= set(s[stat])
            assert 0 < s[stat]["p50"] <= s[stat]["p99"]
        assert s["request_throughput"] > 0 and s["output_tokens"] == 12 * 4
        assert math.isfinite(s["load_max_over_mean"]) and s["load_max_over_mean"] >= 1.0
        assert len(data["ttft"][name]) == 12
        per = data["per_replica"][name]
        assert set(per) == set(fleet.names)
        # vLLM's own request counters and the router's replica header agree
        assert sum(r["requests"] for r in per.values()) == 12
        assert sum(r["requests_seen"] for r in per.values()) == 12
    # the router's own branch counters: one at a time, the prefix policy never leaves home
    assert data["branches"] == {"router-prefix": {"home": 12},
                                "router-round_robin": {"round_robin": 12}}
    # same requests, same prompt tokens queried, whichever replica served them
    assert prefix["query_tokens"] == rr["query_tokens"] > 0
    assert prefix["hit_tokens"] > 0
    assert prefix["hit_rate"] >= rr["hit_rate"]
    # the ceiling renders and tokenises as vLLM does: the same prompt tokens, and one cache of
    # both replicas' blocks that holds every prompt hits at least what either policy did
    ceiling = data["ceiling"]
    assert ceiling["query_tokens"] == prefix["query_tokens"]
    assert ceiling["block_size"] == 32 and ceiling["requests"] == 12
    assert ceiling["hit_rate"] >= prefix["hit_rate"]

    doc = render({"runs": [data], "machine": {"date": "today"}, "fleet": {"kv_cache_memory": "64M"}})
    assert "| router-prefix |" in doc and "| router-round_robin |" in doc
    assert "closed loop, concurrency 1" in doc
