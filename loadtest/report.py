"""Markdown renderers for run, compare and overhead results. Pure: dicts in, strings out, no I/O.

Inputs are the JSON-shaped dicts the runner, compare and overhead produce (`summarize_run`'s
summary, compare rows, overhead rows), so a report can be re-rendered from a saved JSON file.
Latencies are stored in seconds and shown in milliseconds; a missing or NaN value renders as
"–" (never as 0, which would read as a measurement).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["compare_markdown", "fmt", "ms", "overhead_markdown", "run_markdown", "table"]

DASH = "–"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return None if math.isnan(v) or math.isinf(v) else float(v)


def fmt(v: Any, digits: int = 2) -> str:
    x = _num(v)
    return DASH if x is None else f"{x:.{digits}f}"


def ms(v: Any, digits: int = 0) -> str:
    """Seconds -> milliseconds, one decimal below 10 ms."""
    x = _num(v)
    if x is None:
        return DASH
    x *= 1000.0
    return f"{x:.{max(digits, 1 if x < 10 else 0)}f}"


def pct(v: Any) -> str:
    x = _num(v)
    return DASH if x is None else f"{100 * x:.1f}%"


def table(header: Sequence[str], rows: Sequence[Sequence[str]],
          align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table; ``align`` per column: "l" or "r" (default: first l, rest r)."""
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def errors_cell(summary: Mapping[str, Any]) -> str:
    errs = dict(summary.get("errors") or {})
    if summary.get("not_sent"):
        errs["not_sent"] = summary["not_sent"]
    if not errs:
        return "0"
    return ", ".join(f"{k} {v}" for k, v in sorted(errs.items()))


def run_markdown(summary: Mapping[str, Any], title: str = "run") -> str:
    s = summary
    ttft, e2e, itl = s.get("ttft", {}), s.get("e2e", {}), s.get("itl", {})
    out = [f"## {title}\n",
           f"{s.get('ok', 0)}/{s.get('requests', 0)} requests ok in {fmt(s.get('wall_seconds'), 1)} s; "
           f"errors: {errors_cell(s)}\n",
           table(["metric", "p50", "p90", "p99", "mean", "max"], [
               [name, *(ms(d.get(k)) for k in ("p50", "p90", "p99", "mean", "max"))]
               for name, d in (("TTFT (ms)", ttft), ("E2E (ms)", e2e), ("ITL (ms)", itl))]),
           table(["throughput", "value"], [
               ["requests/s", fmt(s.get("request_throughput"))],
               ["output tokens/s", fmt(s.get("output_token_throughput"), 1)],
               ["fleet prefix-cache hit rate", pct(s.get("hit_rate"))],
               [f"max/mean requests per replica ({s.get('load_source', '')})",
                fmt(s.get("load_max_over_mean"))]])]
    per = s.get("per_replica") or {}
    if per:
        rows = []
        for name, r in per.items():
            q = _num(r.get("query_tokens"))
            h = _num(r.get("hit_tokens"))
            rows.append([name, fmt(r.get("requests"), 0), str(r.get("requests_seen", DASH)),
                         pct(h / q if h is not None and q else None),
                         fmt(r.get("busy_seconds"), 1)])
        out.append(table(["replica", "requests (metrics)", "requests (headers)", "hit rate",
                          "busy s"], rows))
    return "\n".join(out)


COMPARE_HEADER = ["setup", "hit rate", "TTFT p50", "TTFT p90", "TTFT p99", "E2E p50", "E2E p99",
                  "req/s", "tok/s", "max/mean load", "errors"]


def compare_row(setup: str, s: Mapping[str, Any]) -> list[str]:
    ttft, e2e = s.get("ttft", {}), s.get("e2e", {})
    return [setup, pct(s.get("hit_rate")), ms(ttft.get("p50")), ms(ttft.get("p90")),
            ms(ttft.get("p99")), ms(e2e.get("p50")), ms(e2e.get("p99")),
            fmt(s.get("request_throughput")), fmt(s.get("output_token_throughput"), 0),
            fmt(s.get("load_max_over_mean")), errors_cell(s)]


def compare_markdown(results: Mapping[str, Any]) -> str:
    """``results``: ``{"workloads": {name: {"setups": {setup: summary}, "skipped": {...}}}}``."""
    out = []
    for wl, block in results.get("workloads", {}).items():
        out.append(f"### {wl}\n")
        meta = block.get("workload") or {}
        if meta:
            out.append(", ".join(f"{k}={v}" for k, v in meta.items() if k != "name") + "\n")
        rows = [compare_row(name, s) for name, s in block.get("setups", {}).items()]
        out.append("TTFT/E2E in ms.\n")
        out.append(table(COMPARE_HEADER, rows))
        skipped = block.get("skipped") or {}
        for name, why in skipped.items():
            out.append(f"- **{name}** skipped: {why}\n")
    return "\n".join(out)


OVERHEAD_HEADER = ["setup", "mode", "concurrency", "requests", "p50 ms", "p99 ms",
                   "added p50 ms", "CPU µs/request", "CPU µs/chunk", "errors"]


def overhead_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for r in rows:
        lat = r.get("latency", {})
        lines.append([str(r.get("setup")), str(r.get("mode")), str(r.get("concurrency")),
                      str(r.get("requests")), ms(lat.get("p50"), 2), ms(lat.get("p99"), 2),
                      ms(r.get("added_p50"), 3),
                      fmt(_scale(r.get("cpu_per_request"), 1e6), 0),
                      fmt(_scale(r.get("cpu_per_chunk"), 1e6), 1), str(r.get("errors", 0))])
    return table(OVERHEAD_HEADER, lines)


def _scale(v: Any, k: float) -> float | None:
    x = _num(v)
    return None if x is None else x * k
