"""The Grafana dashboard loads, and every metric its PromQL uses is one the router or the
simulated vLLM replica really exports — checked against live /metrics scrapes of both."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ThreadedServer

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/prefix-router-dashboard.json"
PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "by",
                "without", "histogram_quantile", "clamp_min", "and", "or", "unless", "on"}
HIT_RATE = ("rate(vllm:prefix_cache_hits_total[5m])) / "
            "sum(rate(vllm:prefix_cache_queries_total[5m]))")


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def exprs() -> list[str]:
    return [t["expr"] for p in load()["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: what is left after removing label matchers,
    grouping clauses, ranges, numbers and function names."""
    e = re.sub(r"\{[^}]*\}", "", expr)
    e = re.sub(r"\b(by|without)\s*\([^)]*\)", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    idents = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e))
    return {i for i in idents if i not in PROMQL_WORDS}


def test_dashboard_structure() -> None:
    d = load()
    assert d["uid"] == "prefix-router" and d["title"]
    assert [v["type"] for v in d["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24


def test_dashboard_covers_the_required_views() -> None:
    text = "\n".join(exprs())
    assert HIT_RATE in text
    for needle in [
        "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(prefix_router_time_to_first_byte_seconds_bucket",
        "histogram_quantile(0.5, sum by (le) (rate(prefix_router_time_to_first_byte_seconds_bucket",
        "sum by (branch) (rate(prefix_router_requests_total",
        "prefix_router_spills_total", "prefix_router_ejections_total",
        "prefix_router_in_flight", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "prefix_router_distinct_keys_per_minute", "prefix_router_scrape_failures_total",
        "sum(rate(prefix_router_predicted_cached_tokens_total[5m]))",
        "sum(rate(prefix_router_reported_cached_tokens_total[5m]))",
    ]:
        assert needle in text, needle


def test_metric_name_extraction() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, replica) (rate('
                        'prefix_router_time_to_first_byte_seconds_bucket{a="b"}[5m])))') == {
        "prefix_router_time_to_first_byte_seconds_bucket"}
    assert metric_names(HIT_RATE) == {"vllm:prefix_cache_hits_total",
                                      "vllm:prefix_cache_queries_total"}


def exported_names(text: str) -> set[str]:
    """Sample names in a Prometheus text exposition, plus the series a declared family will
    have once it is observed (a labelled histogram shows only # TYPE before its first sample)."""
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    for m in re.finditer(r"^# TYPE (\S+) (\w+)", text, re.M):
        name, kind = m.groups()
        base = name.removesuffix("_total")
        names.add(name)
        if kind == "counter":
            names.add(base + "_total")
        elif kind == "histogram":
            names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


@pytest.fixture(scope="module")
def live_scrapes() -> Iterator[tuple[str, str]]:
    """/metrics of a real router app fronting a real simulated replica, after one request."""
    try:
        from loadtest.replica import Replica, ReplicaConfig
        from router.app import create_app
        from router.settings import Settings
    except ImportError as exc:  # pragma: no cover - only while those packages are being built
        pytest.skip(f"router app or simulated replica not importable: {exc}")
    replica = ThreadedServer(Replica(ReplicaConfig(name="sim-0", instant=True))).start()
    router = None
    try:
        settings = Settings.from_dict({"replicas": [{"name": "sim-0", "url": replica.url}],
                                       "logging": {"access_log": False}})
        router = ThreadedServer(create_app(settings)).start()
        with httpx.Client(timeout=10) as client:
            r = client.post(router.url + "/v1/chat/completions", json={
                "model": "sim-model", "max_tokens": 4,
                "messages": [{"role": "system", "content": "You are helpful. " * 10},
                             {"role": "user", "content": "hello"}]})
            assert r.status_code == 200, r.text
            yield (client.get(router.url + "/metrics").text,
                   client.get(replica.url + "/metrics").text)
    finally:
        if router is not None:
            router.stop()
        replica.stop()


def test_every_dashboard_metric_is_exported_live(live_scrapes: tuple[str, str]) -> None:
    router_text, replica_text = live_scrapes
    exported = exported_names(router_text) | exported_names(replica_text)
    # the scrape really contains samples, not just declarations
    assert re.search(r'^prefix_router_requests_total\{.*\} 1\.0$', router_text, re.M)
    assert re.search(r"^vllm:prefix_cache_queries_total\{.*\} [1-9]", replica_text, re.M)
    used = set().union(*map(metric_names, exprs()))
    assert used, "no metric names found in the dashboard"
    missing = sorted(used - exported)
    assert not missing, f"dashboard uses metrics nobody exports: {missing}"
