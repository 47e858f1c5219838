"""loadtest.bench_kv: the setups it names parse, and its page block renders and judges."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.bench_kv import (
    BLOCK,
    SETUPS,
    SPLIT,
    STEADY_BLOCK,
    cached_counters,
    render,
    shown_args,
    verdicts,
)
from loadtest.compare import KV_EVENTS_CONFIG, FleetParams
from loadtest.doc_blocks import blocks, keep_blocks
from loadtest.setups import parse_setup


def row(hit: float, p90: float, **kw: Any) -> dict[str, Any]:
    return {"hit_rate": hit, "ttft": {"p50": p90 / 2, "p90": p90, "p99": p90 * 2},
            "output_token_throughput": 100.0, "router_cpu_per_request_us": 500.0, **kw}


def test_setup_names_round_trip_and_kv_is_a_router_variant() -> None:
    for name in (*SETUPS, *SPLIT):
        assert parse_setup(name).name == name
    assert parse_setup("router-cache_aware-x2+kv").single.kv
    assert FleetParams(kv_events=True).replica_options()["kv_events_config"] == KV_EVENTS_CONFIG
    assert "kv_events_config" not in FleetParams().replica_options()


def test_render_is_a_kept_block_with_verdicts() -> None:
    data: dict[str, Any] = {
        "machine": {"commit": "abc", "date": "d", "nproc": 2},
        "cells": {"cache-pressure": {
            "workload": {"requests": 10, "rate": 1.0, "prompts": 24, "min_prompt_tokens": 2500,
                         "max_prompt_tokens": 3500},
            "setups": {"router-cache_aware+kv": row(0.8, 0.2, predicted=90.0, reported=100.0),
                       "sglang-cache_aware": row(0.7, 0.5),
                       "router-cache_aware-x1+kv": row(0.8, 0.2),
                       "router-cache_aware-x2+kv": row(0.795, 0.2)},
            "failed": {}}}}
    data["verdicts"] = verdicts(data)
    assert any("0.40x" in v and "met" in v and "+10.0 points" in v for v in data["verdicts"])
    assert any("2 precise routers" in v and "-0.5 points" in v for v in data["verdicts"])
    text = render(data)
    assert "| router-cache_aware+kv | 80.0% | - | 100 | 200 | 400 |" in text
    assert "0.900" in text  # predicted / reported
    # `make bench` regenerates the page and keeps the block
    assert BLOCK in blocks(keep_blocks("old\n" + text, "new page\n"))


def test_render_shows_each_setup_against_the_cells_ceiling() -> None:
    data: dict[str, Any] = {
        "machine": {"commit": "abc", "date": "d", "nproc": 2},
        "cells": {"cache-pressure": {
            "workload": {"requests": 10, "rate": 1.0, "prompts": 24, "min_prompt_tokens": 2500,
                         "max_prompt_tokens": 3500},
            "setups": {"router-cache_aware+kv": row(0.36, 0.2),
                       "sglang-cache_aware": row(0.38, 0.5)},
            "failed": {}, "ceiling": {"hit_rate": 0.40}, "opt_bound": {"hit_rate": 0.42}}}}
    data["verdicts"] = verdicts(data)
    # 40% - 38% is the LRU ceiling's room, a reference; the OPT bound 42% is the proof: 38% + 5
    # points = 43% is above it, so the +5 target is infeasible for any router
    assert any("ceiling 40.0%: +2.0 points" in v and "not a bound" in v
               for v in data["verdicts"])
    assert any("OPT bound 42.0%" in v and "= 43.0% exceeds it" in v and "infeasible" in v
               for v in data["verdicts"])
    text = render(data)
    assert "One-cache ceiling" in text and "40.0%" in text and "OPT bound" in text
    assert "| router-cache_aware+kv | 36.0% | 0.90 | 100 | 200 | 400 |" in text
    assert "| sglang-cache_aware | 38.0% | 0.95 |" in text


@pytest.mark.parametrize(("sglang_hit", "opt", "verdict"), [
    (0.383, 0.576, "is within it (14.3 points below) - the bound does not rule"),  # room left
    (0.383, 0.433, "is within it (0.0 points below)"),  # exactly +5 is not ruled out
    (0.383, 0.40, "exceeds it - the +5 target is infeasible for any router"),  # no room
])
def test_cache_pressure_verdict_holds_sglang_plus_five_against_the_opt_bound(
        sglang_hit: float, opt: float, verdict: str) -> None:
    data: dict[str, Any] = {"cells": {"cache-pressure": {
        "setups": {"router-cache_aware+kv": row(0.36, 0.2),
                   "sglang-cache_aware": row(sglang_hit, 0.5)},
        "failed": {}, "ceiling": {"hit_rate": 0.378}, "opt_bound": {"hit_rate": opt}}}}
    (line,) = [v for v in verdicts(data) if "OPT bound" in v]
    assert verdict in line, line


def test_cell_bounds_of_a_small_cache_pressure_cell(tmp_path: Any) -> None:
    # 40 requests over 10 groups on 2 replicas of 900 blocks: OPT >= the LRU ceiling
    from dataclasses import replace

    from loadtest.bench_kv import CACHE_PRESSURE, cell_bounds
    from loadtest.cells import cell_requests

    w = replace(CACHE_PRESSURE, requests=40, spec={**CACHE_PRESSURE.spec, "prompts": 10},
                fleet=replace(CACHE_PRESSURE.fleet, replicas=2, kv_blocks=900))
    reqs, _meta = cell_requests(w, 1, tmp_path)
    b = cell_bounds(reqs, w)
    assert 0 < b["ceiling"]["hit_rate"] <= b["opt_bound"]["hit_rate"] < 1
    assert b["opt_bound"]["num_blocks"] == 1800


def test_a_longer_run_writes_its_own_block_with_its_command() -> None:
    data: dict[str, Any] = {
        "machine": {"commit": "abc", "date": "d", "nproc": 2},
        "argv": shown_args(["--requests", "720", "--doc", "/tmp/x.md", "--out=/tmp/x.json",
                            "--block", STEADY_BLOCK]),
        "cells": {"cache-pressure": {
            "workload": {"requests": 720, "rate": 6.0, "prompts": 75, "min_prompt_tokens": 5000,
                         "max_prompt_tokens": 7000},
            "setups": {"router-cache_aware+kv": row(0.36, 2.0)}, "failed": {}}}}
    text = render(data, STEADY_BLOCK)
    assert STEADY_BLOCK in blocks(text)
    assert BLOCK not in blocks(text)
    assert f"`python -m loadtest.bench_kv --requests 720 --block {STEADY_BLOCK}`" in text
    assert "/tmp" not in text


def test_render_simulated_block() -> None:
    from loadtest.bench_kv import SIM_BLOCK, render_simulated

    setups = {"cache_aware+kv": {**row(0.6, 0.4), "ceiling": 0.62, "load_max_over_mean": 1.1},
              "cache_aware": {**row(0.58, 0.8), "ceiling": 0.62, "load_max_over_mean": 1.1},
              "sglang_model": {**row(0.5, 1.0), "ceiling": 0.62, "load_max_over_mean": 1.0}}
    text = render_simulated({"cache-pressure, 4 replicas": {
        "requests": 10, "rate": 1.0, "groups": 2, "prefix_tokens": [100, 200],
        "setups": setups, "opt_bound": 0.7}}, {"commit": "abc", "date": "d"})
    assert SIM_BLOCK in blocks(text)
    assert "TTFT p90 0.40x (target <= 0.5), hit rate +10.0 points" in text
    assert "| cache_aware+kv | 60.0% | 0.97 | 200 | 400 | 800 | 1.10 |" in text
    # 50% + 5 points = 55% is below the OPT bound 70%: not ruled out
    assert "OPT bound (Belady's MIN" in text and "(55.0%) is not ruled out" in text


def test_cached_counters_sum_over_labels_and_ignore_other_metrics() -> None:
    text = "\n".join([
        "# TYPE prefix_router_predicted_cached_tokens_total counter",
        'prefix_router_predicted_cached_tokens_total{replica="r0"} 100.0',
        'prefix_router_predicted_cached_tokens_total{replica="r1"} 28.0',
        'prefix_router_reported_cached_tokens_total{replica="r0"} 64.0',
        'prefix_router_requests_total{branch="home"} 7.0',
    ])
    assert cached_counters(text) == {"predicted": 128.0, "reported": 64.0}
    assert cached_counters("") == {}
