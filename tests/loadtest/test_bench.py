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
    assert {"nginx", "sglang-cache_aware", "sglang-round_robin", "smg-cache_aware",
            "vllm-cache_aware", "vllm-consistent_hash", "vllm-power_of_two"} <= set(bench.setups())
    # a policy the router gains is benchmarked, and several processes of it measured
    monkeypatch.setattr(rs, "POLICIES", tuple(p for p in rs.POLICIES if p != "cache_aware"))
    monkeypatch.setattr(rs.RoutingSettings, "policy", "prefix")
    assert bench.judged() == ["router-prefix"] and "router-cache_aware" not in bench.setups()
    monkeypatch.setattr(rs, "POLICIES", (*rs.POLICIES, "cache_aware"))
    assert "router-cache_aware" in bench.setups()
    assert bench.split_setups() == ["router-cache_aware-x1", "router-cache_aware-x2",
                                    "router-cache_aware-x4", "sglang-cache_aware-x2",
                                    "vllm-cache_aware-x2"]
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


def _cell_summary(hit: float, p99: float, load: float) -> dict[str, Any]:
    return {"hit_rate": hit, "load_max_over_mean": load, "ok": 160, "errors": 0,
            "ttft": {"p50": 0.02, "p90": p99 / 2, "p99": p99}, "e2e": {"p50": 0.1, "p99": 1.0}}


def test_render_only_shows_the_hit_bound_verdict(tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # a small synthetic bench.json (build/bench/ is not kept in the repository): the targets
    # table says when the bound at max/mean <= 1.3 is below sglang-router's hit rate
    import json

    monkeypatch.setattr(bench, "_figures", lambda data, img: {})
    block = {"workload": {"name": "shared-prefix", "requests": 320, "rate": 40.0},
             "fleet": {"replicas": 8, "kv_blocks": 768},
             "ceiling": {"hit_rate": 0.9673, "requests": 320, "num_blocks": 6144},
             "bounds": {"target": 1.3, "at_target": {"hit_rate": 0.9593}},
             "setups": {"router-cache_aware": _cell_summary(0.964, 0.34, 1.95),
                        "sglang-cache_aware": _cell_summary(0.960, 0.44, 3.15),
                        "router-round_robin": _cell_summary(0.578, 1.2, 1.0)}}
    data = {"machine": {}, "timings": {},
            "compare": {"ours": "router-cache_aware", "judged": ["router-cache_aware"],
                        "workloads": {"shared-prefix, 8 replicas": block}}}
    (tmp_path / "bench.json").write_text(json.dumps(data))
    doc = tmp_path / "benchmarks.md"
    assert bench.main(["--render-only", "--json-dir", str(tmp_path), "--doc", str(doc),
                       "--img", str(tmp_path / "img")]) == 0
    text = doc.read_text()
    assert ("| shared-prefix | 8 | 96.4% vs 96.0%: met | 1.00 | 340 vs 440 (0.77): met | "
            "340 vs 1200: met | 1.95: **missed** | 95.93% < 96.00%: **both targets cannot be "
            "met together (any router)** |") in text


def test_bounds_of_a_cell_from_its_requests(tmp_path: Any) -> None:
    # a small rag cell: the bounds the targets table reads, ordered as the theory says
    from dataclasses import replace

    w = replace(next(w for w in bench.WORKLOADS if w.name == "rag"), requests=24)
    reqs, _meta = bench.cell_requests(w, 0, tmp_path)
    b = bench.bounds(reqs, w)
    assert b["target"] == 1.3 and b["at_target"]["cap"] == int(1.3 * 24 / 4)
    assert b["at_target"]["hit_rate"] <= b["infinite"]["hit_rate"]
    assert b["ceiling"]["hit_rate"] <= b["opt"]["hit_rate"] <= b["infinite"]["hit_rate"]
    assert 0 < b["at_target"]["hit_rate"] < 1


def test_render_only_writes_the_goodput_block(tmp_path: Any) -> None:
    # make bench's part 4: the saved goodput results become the doc's goodput block and a plot
    import json

    step = {"rate": 10.0, "ttft_p99": 0.4, "ttft_p50": 0.1, "errors": 0, "requests": 16,
            "hit_rate": 0.7}
    res = {"workload": {"name": "multi-turn"}, "replicas": 4, "slo": 1.0, "rates": [10.0, 12.5],
           "duration": 8.0, "seed": 0, "machine": {"commit": "abc"}, "failed": {},
           "setups": {"router-cache_aware": {
               "goodput": 10.0, "goodput_per_replica": 2.5, "ceiling": False,
               "steps": [step, {**step, "rate": 12.5, "ttft_p99": 1.5}]}}}
    (tmp_path / "bench.json").write_text(json.dumps({"machine": {}, "timings": {},
                                                     "goodput": [res]}))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# old\n\n<!-- goodput:begin -->\nstale\n<!-- goodput:end -->\n")
    assert bench.main(["--render-only", "--json-dir", str(tmp_path), "--doc", str(doc),
                       "--img", str(tmp_path / "img")]) == 0
    text = doc.read_text()
    assert "stale" not in text and text.count("<!-- goodput:begin -->") == 1
    assert "| router-cache_aware | 2.50 | 400, 1500 | 70.0% |" in text
    assert "(img/bench-goodput-multi-turn-4.png)" in text
    assert (tmp_path / "img" / "bench-goodput-multi-turn-4.png").exists()
