"""Percentiles, Prometheus parsing and counter deltas on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from loadtest.stats import (
    HITS,
    QUERIES,
    counter_delta,
    fleet_hit_rate,
    max_over_mean,
    parse_prometheus,
    percentile,
    summarize,
)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),  # interpolates between the two middle ranks
        ([1, 2, 3, 4], 0, 1),  # p0 is the minimum
        ([1, 2, 3, 4], 100, 4),  # p100 is the maximum
        ([10], 99, 10),  # one value
        (list(range(1, 101)), 90, 90.1),  # (100-1)*0.9 = 89.1 -> v[89] + 0.1
        ([5, 1, 3], 50, 3),  # unsorted input
    ],
)
def test_percentile(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected)


def test_percentile_edges() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1], 101)
    s = summarize([1, 2, 3, 4])
    assert s["count"] == 4 and s["mean"] == 2.5 and s["max"] == 4


SCRAPE = """# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 300.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4000.0
vllm:num_requests_running{model_name="m"} 3
process_cpu_seconds_total 1.5
weird_line_without_value
label_with_brace{path="/a}b"} 7
nan_metric NaN
"""


def test_parse_prometheus_sums_label_sets() -> None:
    m = parse_prometheus(SCRAPE)
    assert m[HITS] == 1500.0
    assert m[QUERIES] == 4000.0
    assert m["vllm:num_requests_running"] == 3
    assert m["process_cpu_seconds_total"] == 1.5
    assert m["label_with_brace"] == 7  # a brace inside a label value does not confuse the parser
    assert "weird_line_without_value" not in m and "nan_metric" not in m


def test_counter_delta_handles_restart() -> None:
    assert counter_delta({"c": 10}, {"c": 25}, "c") == 15
    assert counter_delta({"c": 100}, {"c": 7}, "c") == 7  # counter reset: take the new value
    assert counter_delta({}, {"c": 3}, "c") == 3


def test_fleet_hit_rate_from_deltas() -> None:
    before = {"a": {HITS: 100, QUERIES: 1000}, "b": {HITS: 0, QUERIES: 0}}
    after = {"a": {HITS: 700, QUERIES: 2000}, "b": {HITS: 100, QUERIES: 1000}}
    r = fleet_hit_rate(before, after)
    assert r["a"] == pytest.approx(0.6)  # 600 / 1000
    assert r["b"] == pytest.approx(0.1)
    assert r["fleet"] == pytest.approx(700 / 2000)


def test_max_over_mean() -> None:
    assert max_over_mean([10, 10, 10, 10]) == 1.0
    assert max_over_mean([40, 0, 0, 0]) == 4.0
    assert math.isnan(max_over_mean([]))
