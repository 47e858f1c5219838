"""make bench's matrix: cells scale with the fleet, setups follow the router's policies."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest import bench
from loadtest.compare import FleetParams


def test_a_cell_at_eight_replicas_has_the_same_load_per_replica() -> None:
    w = bench.BenchWorkload("rag", 140, 14.0, FleetParams(kv_blocks=1024), {"turns": 3})
    big = w.at(8)
    assert (big.requests, big.rate, big.fleet.replicas, big.fleet.kv_blocks) == (280, 28.0, 8, 1024)
    assert big.spec == w.spec and big.key == "rag, 8 replicas" and w.key == "rag, 4 replicas"
    names = [c.name for c in bench.WORKLOADS]
    assert names == ["shared-prefix", "hot-prefix", "multi-turn", "mooncake", "rag", "agent"]
    assert bench.FLEETS == (4, 8)


def test_setups_follow_the_router_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    import router.settings as rs

    assert bench.setups()[0] == f"router-{rs.RoutingSettings.policy}"  # the default first
    assert {f"router-{p}" for p in rs.POLICIES} <= set(bench.setups())
    assert {"nginx", "sglang-cache_aware", "sglang-round_robin"} <= set(bench.setups())
    # a policy the router gains is benchmarked, and several processes of it measured
    monkeypatch.setattr(rs, "POLICIES", tuple(p for p in rs.POLICIES if p != "cache_aware"))
    monkeypatch.setattr(rs.RoutingSettings, "policy", "prefix")
    assert bench.judged() == ["router-prefix"] and "router-cache_aware" not in bench.setups()
    monkeypatch.setattr(rs, "POLICIES", (*rs.POLICIES, "cache_aware"))
    assert "router-cache_aware" in bench.setups()
    assert bench.split_setups() == ["router-cache_aware-x1", "router-cache_aware-x2",
                                    "router-cache_aware-x4", "sglang-cache_aware-x2"]
    assert bench.judged() == ["router-prefix", "router-cache_aware"]  # the candidate too
    # ... and the targets judge whichever is the default
    monkeypatch.setattr(rs.RoutingSettings, "policy", "cache_aware")
    assert bench.setups()[0] == "router-cache_aware" and bench.default_policy() == "cache_aware"
    assert bench.judged() == ["router-cache_aware"]


def test_bench_vllm_reads_the_cache_size_a_replica_reports(threaded_server: Any) -> None:
    from loadtest.bench_vllm import cache_config
    from loadtest.replica import Replica, ReplicaConfig

    srv = threaded_server(Replica(ReplicaConfig(instant=True, kv_blocks=300, block_size=32)))
    assert cache_config(srv.url) == (32, 300)


def test_bench_vllm_cache_config_is_the_block_size_label_not_hash_block_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from loadtest import bench_vllm

    text = ('vllm:cache_config_info{hash_block_size="16",block_size="32",'
            'enable_prefix_caching="True",num_gpu_blocks="256"} 1.0\n')
    monkeypatch.setattr(bench_vllm.urllib.request, "urlopen",
                        lambda *_a, **_k: io.BytesIO(text.encode()))
    assert bench_vllm.cache_config("http://x") == (32, 256)


def test_bench_vllm_page_shows_the_ceiling_and_the_default_policy_against_both() -> None:
    from loadtest.bench_vllm import render

    def s(hit: float, p99: float) -> dict[str, Any]:
        return {"hit_rate": hit, "hit_tokens": hit * 1000, "query_tokens": 1000.0,
                "ttft": {"p50": 0.05, "p90": 0.1, "p99": p99}, "e2e": {},
                "load_max_over_mean": 1.2}

    block = {"config": {"name": "popular prompts", "policies": ["cache_aware", "prefix",
                                                                "round_robin"]},
             "setups": {"router-cache_aware": s(0.8, 0.4), "router-prefix": s(0.7, 0.5),
                        "router-round_robin": s(0.5, 0.3)},
             "ceiling": {"hit_rate": 0.9, "hit_tokens": 900, "query_tokens": 1000,
                         "num_blocks": 512, "block_size": 32}}
    doc = render({"runs": [block]})
    assert "One-cache ceiling (the same requests through one cache of 512 blocks of 32" in doc
    assert "90.0% (900 of 1000 prompt tokens; vLLM counted 1000)" in doc
    assert "cache_aware 0.89, prefix 0.78, round_robin 0.56" in doc
    assert "cache_aware 80.0% vs round-robin 50.0%" in doc
    assert "cache_aware 80.0% vs prefix 70.0%" in doc
    assert "cache_aware's TTFT p99 is above round-robin's." in doc
