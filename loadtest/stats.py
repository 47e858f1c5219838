"""Measurement arithmetic: percentiles, Prometheus scrapes and their deltas, load balance.

* Percentiles use linear interpolation between closest ranks (numpy's default ``linear`` method):
  for sorted values v[0..n-1], p-th percentile = v[i] + (v[i+1]-v[i]) * f where i+f = (n-1)*p/100.
* A fleet's prefix-cache hit rate over a run is computed from the replicas' own counters:
  ``sum(delta vllm:prefix_cache_hits_total) / sum(delta vllm:prefix_cache_queries_total)``, summing
  over replicas and label sets. Deltas are taken between a scrape before and after the run; a
  counter that went down (replica restarted) contributes its post-restart value, as Prometheus'
  ``increase()`` does.
* Load balance is ``max / mean`` of a per-replica quantity (1.0 = perfectly even).

All functions are pure; scraping (I/O) lives in the runner.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "HITS",
    "QUERIES",
    "counter_delta",
    "fleet_hit_rate",
    "max_over_mean",
    "parse_prometheus",
    "percentile",
    "summarize",
]

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    return _interpolate(sorted(values), p)


def _interpolate(v: Sequence[float], p: float) -> float:
    """The p-th percentile of the non-empty, already sorted ``v``."""
    pos = (len(v) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p90, p99, max of ``values``."""
    if not values:
        return {"count": 0, "mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
    v = sorted(values)
    return {
        "count": len(values),
        "mean": sum(values) / len(values),
        "p50": _interpolate(v, 50),
        "p90": _interpolate(v, 90),
        "p99": _interpolate(v, 99),
        "max": max(values),
    }


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric family's samples over label sets: ``{"vllm:prefix_cache_hits_total": 123.0}``.

    Only sample lines are read (``name{labels} value [timestamp]``); comments and malformed
    lines are skipped. Metric names may contain colons, as vLLM's do.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            close = rest.rfind("}")
            if close < 0:
                continue
            fields = rest[close + 1 :].split()
        else:
            parts = line.split()
            name, fields = parts[0], parts[1:]
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float:
    a = after.get(name, 0.0)
    b = before.get(name, 0.0)
    return a - b if a >= b else a


def fleet_hit_rate(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, float]:
    """Per-replica and fleet hit rate from two scrapes keyed by replica name."""
    hits = queries = 0.0
    out: dict[str, float] = {}
    for name, snap in after.items():
        prev = before.get(name, {})
        h = counter_delta(prev, snap, HITS)
        q = counter_delta(prev, snap, QUERIES)
        out[name] = h / q if q else 0.0
        hits += h
        queries += q
    out["fleet"] = hits / queries if queries else 0.0
    out["hit_tokens"] = hits
    out["query_tokens"] = queries
    return out


def max_over_mean(values: Iterable[float]) -> float:
    vals = list(values)
    if not vals:
        return math.nan
    mean = sum(vals) / len(vals)
    return max(vals) / mean if mean else math.nan
