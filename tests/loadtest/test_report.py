"""Markdown and JSON rendering of run, compare, overhead and bench results (pure, no servers)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from loadtest.bench_doc import benchmarks_markdown
from loadtest.client import ErrorKind, Outcome
from loadtest.report import (
    compare_markdown,
    fmt,
    ms,
    one_replica_setups,
    overhead_markdown,
    overhead_targets_markdown,
    run_markdown,
    table,
)
from loadtest.runner import RunResult, summarize_run

BEFORE = {"sim-0": {"vllm:prefix_cache_hits_total": 100.0, "vllm:prefix_cache_queries_total": 200.0,
                    "sim:requests_total": 5.0},
          "sim-1": {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0,
                    "sim:requests_total": 0.0}}
AFTER = {"sim-0": {"vllm:prefix_cache_hits_total": 400.0, "vllm:prefix_cache_queries_total": 600.0,
                   "sim:requests_total": 8.0},
         "sim-1": {"vllm:prefix_cache_hits_total": 100.0, "vllm:prefix_cache_queries_total": 400.0,
                   "sim:requests_total": 1.0}}


def _outcomes() -> list[Outcome]:
    return [
        Outcome(0, 0.0, 200, ttft=0.010, e2e=0.050, itl=(0.01, 0.02), output_tokens=3,
                replica="sim-0"),
        Outcome(1, 0.01, 200, ttft=0.030, e2e=0.070, itl=(0.01,), output_tokens=2,
                replica="sim-0"),
        Outcome(2, 0.02, 200, ttft=0.020, e2e=0.040, output_tokens=1, replica="sim-1"),
        Outcome(3, 0.03, 503, ErrorKind.HTTP_5XX, "overloaded", replica="sim-1"),
    ]


def test_summary_arithmetic() -> None:
    s = summarize_run(_outcomes(), 2.0, BEFORE, AFTER, not_sent=1)
    assert (s["requests"], s["sent"], s["ok"], s["error_count"]) == (5, 4, 3, 2)
    assert s["errors"] == {"http_5xx": 1}
    assert s["error_examples"] == {"http_5xx": "overloaded"}
    assert s["hit_rate"] == pytest.approx((300 + 100) / (400 + 400))
    assert s["ttft"]["p50"] == pytest.approx(0.020)
    assert s["itl"]["count"] == 3
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_token_throughput"] == pytest.approx(3.0)
    # requests per replica come from the replicas' counters: 3 and 1 -> max/mean 1.5
    assert s["per_replica"]["sim-0"]["requests"] == 3
    assert s["load_max_over_mean"] == pytest.approx(1.5)
    assert s["load_source"] == "replica counters"
    assert s["per_replica"]["sim-0"]["busy_seconds"] == pytest.approx(0.08)


def test_load_falls_back_to_response_headers_without_scrapes() -> None:
    s = summarize_run(_outcomes(), 1.0, {}, {})
    assert s["load_source"] == "response headers"
    assert s["load_max_over_mean"] == pytest.approx(2 / 2)  # two headers each
    assert math.isnan(s["hit_rate"])


def test_run_markdown_and_json() -> None:
    res = RunResult({"mode": "open"}, {"name": "w"}, 2.0, tuple(_outcomes()), 1, BEFORE, AFTER)
    md = run_markdown(res.summary(), "w -> r")
    assert md.startswith("## w -> r")
    assert "3/5 requests ok" in md and "http_5xx 1" in md and "not_sent 1" in md
    assert "| TTFT (ms) | 20 | 28 | 30 |" in md        # p50/p90/p99 in ms
    assert "| fleet prefix-cache hit rate | 50.0% |" in md
    assert "| sim-0 | 3 | 2 | 75.0% |" in md
    data = json.loads(json.dumps(res.to_json()))       # standard JSON: NaN became null
    assert data["summary"]["ok"] == 3 and len(data["outcomes"]) == 4
    assert data["outcomes"][3]["error"] == "http_5xx"
    empty = RunResult({}, {}, 0.0, (), 0)
    assert json.loads(json.dumps(empty.to_json()))["summary"]["ttft"]["p50"] is None


@pytest.mark.parametrize(("value", "expected"), [
    (None, "–"), (math.nan, "–"), (math.inf, "–"), ("x", "–"),   # never rendered as 0
    (0.0123, "12"), (0.00123, "1.2"), (1.5, "1500"),             # ms: one decimal below 10
])
def test_ms(value: Any, expected: str) -> None:
    assert ms(value) == expected


def test_fmt_and_table() -> None:
    assert fmt(1.23456) == "1.23" and fmt(None) == "–"
    t = table(["a", "b"], [["x", "1"]])
    assert t.splitlines() == ["| a | b |", "| --- | ---: |", "| x | 1 |"]


def _compare_results() -> dict[str, Any]:
    def summary(hit: float, p99: float, load: float, per: dict[str, float]) -> dict[str, Any]:
        return {"hit_rate": hit, "ttft": {"p50": p99 / 4, "p90": p99 / 2, "p99": p99},
                "e2e": {"p50": 0.2, "p99": 0.9}, "request_throughput": 10.0,
                "output_token_throughput": 160.0, "load_max_over_mean": load, "errors": {},
                "per_replica": {k: {"requests": v} for k, v in per.items()}}
    return {"workloads": {"shared-prefix": {
        "workload": {"name": "shared-prefix", "requests": 40},
        "setups": {"router-prefix": summary(0.9, 0.4, 1.2, {"a": 22, "b": 18}),
                   "router-round_robin": summary(0.4, 0.8, 1.0, {"a": 20, "b": 20}),
                   "sglang-cache_aware": summary(0.85, 0.6, 1.1, {"a": 21, "b": 19}),
                   "vllm-consistent_hash": summary(0.7, 2.0, 2.0, {"a": 40, "b": 0})},
        "ttft": {}, "skipped": {"vllm-cache_aware": "vllm-router is not installed"}}}}


def test_compare_markdown_has_a_row_per_setup_and_the_skips() -> None:
    md = compare_markdown(_compare_results())
    assert "### shared-prefix" in md
    assert "| router-prefix | 90.0% | 100 | 200 | 400 | 200 | 900 | 10.00 | 160 | 1.20 | 0 |" in md
    assert "| router-round_robin | 40.0% |" in md
    assert "**vllm-cache_aware** skipped: vllm-router is not installed" in md


def test_compare_markdown_shows_the_ceiling_and_each_setup_against_it() -> None:
    results = _compare_results()
    results["workloads"]["shared-prefix"]["ceiling"] = {"hit_rate": 0.95, "requests": 40,
                                                        "num_blocks": 1536}
    md = compare_markdown(results)
    assert "| setup | hit rate | ÷ ceiling | TTFT p50 |" in md
    assert "| router-prefix | 90.0% | 0.95 | 100 |" in md  # 0.90 / 0.95
    assert "| router-round_robin | 40.0% | 0.42 |" in md
    assert "one cache of 1536 blocks, the fleet's total): hit rate 95.0%" in md


def test_one_replica_setups() -> None:
    assert one_replica_setups(_compare_results()) == [("shared-prefix", "vllm-consistent_hash", 2)]


def test_overhead_tables() -> None:
    rows = [{"setup": "router-prefix", "mode": "stream", "concurrency": 16, "requests": 100,
             "latency": {"p50": 0.004, "p99": 0.010}, "added_p50": 0.0003,
             "cpu_per_request": 0.0012, "cpu_per_chunk": 0.0012 / 64, "errors": 0}]
    md = overhead_markdown(rows)
    assert "| router-prefix | stream | 16 | 100 | 4.00 | 10.00 | 0.300 | 1200 | 18.8 | 0 |" in md
    t = overhead_targets_markdown({"cpu_per_request_vs_sglang": 2.5, "cpu_per_chunk_vs_sglang": 1.0,
                                   "added_p50_c1_plain": 0.0004,
                                   "cpu_per_request_vs_passthrough": 1.4,
                                   "replica_capacity_vs_router_plain": 3.6,
                                   "replica_capacity_vs_router_stream": 2.4})
    assert "| 2.50 | **missed** |" in t and "| 1.00 | met |" in t and "| 0.400 | met |" in t
    assert "| ≥ 3 | 3.60 | met |" in t and "| ≥ 3 | 2.40 | **missed** |" in t
    assert "passthrough's, non-streamed (issue #18) | ≤ 1.3 | 1.40 | **missed** |" in t


def test_benchmarks_markdown(tmp_path: Path) -> None:
    data = {"machine": {"date": "2026-01-01 00:00 UTC", "nproc": 2, "cpu": "Test CPU"},
            "timings": {"total": 600.0}, "compare": _compare_results()}
    img = tmp_path / "img" / "bench-compare-shared-prefix.png"
    md = benchmarks_markdown(data, {"shared-prefix": img}, tmp_path)
    assert "2026-01-01 00:00 UTC" in md and "2 CPUs (Test CPU)" in md
    assert "![shared-prefix: TTFT CDF, hit rate, load per replica](img/bench-compare-shared-prefix.png)" in md
    assert "`vllm-consistent_hash` sent every request to one of the 2 replicas" in md
    assert "### Targets" in md


def test_benchmarks_markdown_shows_the_capacity_cells(tmp_path: Path) -> None:
    oh = {"config": {"chunks": 64, "rounds": 1, "concurrency": 16, "capacity_requests": 300},
          "rows": [], "ratios": {"replica_capacity_vs_router_stream": 3.2},
          "capacity": [{"setup": "direct", "mode": "stream", "requests": 300,
                        "throughput": 3500.4, "cpu_per_request": 0.0002},
                       {"setup": "router-prefix", "mode": "stream", "requests": 300,
                        "throughput": 1400.0, "cpu_per_request": 0.00064}]}
    md = benchmarks_markdown({"machine": {}, "overhead": oh}, {}, tmp_path)
    assert "| direct | stream | 300 | 3500 | 200 |" in md
    assert "| router-prefix | stream | 300 | 1400 | 640 |" in md
    assert "| ≥ 3 | 3.20 | met |" in md
    without = benchmarks_markdown({"machine": {}, "overhead": {**oh, "capacity": []}}, {}, tmp_path)
    assert "Capacity cells" not in without and "| ≥ 3 | 3.20 | met |" in without


def test_benchmarks_markdown_processes_and_simulation(tmp_path: Path) -> None:
    def s(hit: float, p99: float, per: list[int] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"hit_rate": hit, "ttft": {"p50": 0.02, "p99": p99},
                               "load_max_over_mean": 1.1}
        if per:
            out["router_processes"] = per
        return out

    cmp_ = {"ours": "router-cache_aware", "workloads": {"agent, 8 replicas": {
        "workload": {"name": "agent"}, "fleet": {"replicas": 8}, "ceiling": {"hit_rate": 0.9},
        "setups": {"router-cache_aware": s(0.81, 0.5), "router-cache_aware-x2": s(0.72, 0.7, [9, 11]),
                   "sglang-cache_aware": s(0.8, 0.6), "sglang-cache_aware-x2": s(0.7, 0.9)}}}}
    sim = {"workloads": [{"workload": {"name": "rag", "replicas": 64}, "results": [
        {"config": {"policy": "cache_aware"}, "requests": 10, "hit_rate": 0.6,
         "ceiling": {"hit_rate": 0.62}, "ttft": {"p50": 0.1, "p99": 0.9},
         "load_max_over_mean": 1.2, "wall_seconds": 1.0}]}]}
    md = benchmarks_markdown({"machine": {}, "compare": cmp_, "simulate": sim}, {}, tmp_path)
    assert "### Targets: `router-cache_aware` (the default policy)" in md
    assert "## Several router processes" in md
    assert "| agent, 8 replicas | `router-cache_aware` | 1 (no splitter) | 81.0% | 0.90 |" in md
    assert "| `router-cache_aware` | 2 | 72.0% | 0.80 | 20 | 700 | 1.10 | 9 / 11 |" in md
    assert "| `sglang-cache_aware` | 2 | 70.0% |" in md
    assert "## Fleet scale: discrete-event simulation, 64 replicas" in md
    assert "| cache_aware | 10 | 60.0% | 0.97 | 100 | 900 | 1.20 | 0 | 1.0 |" in md
    assert "| rag | cache_aware | 60.0% | 62.0% | 0.97 | 1.20 | met |" in md
