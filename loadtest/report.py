"""Markdown renderers for run, compare, overhead and target results. Pure: dicts in, strings out.

The page `make bench` writes (docs/benchmarks.md) is assembled from these by
`loadtest.bench_doc`.

Inputs are the JSON-shaped dicts the runner, compare and overhead produce (`summarize_run`'s
summary, compare rows, overhead rows), so a report can be re-rendered from a saved JSON file.
Latencies are stored in seconds and shown in milliseconds; a missing or NaN value renders as
"–" (never as 0, which would read as a measurement).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.targets import GEOMEAN_P99, MAX_LOAD, OF_CEILING, Cell, SimRow, geomeans

__all__ = ["DASH", "capacity_lines", "compare_markdown", "fmt", "ms", "one_replica_setups",
           "overhead_markdown", "overhead_targets_markdown", "pct", "run_markdown",
           "sim_targets_markdown", "slug", "table", "targets_markdown"]

DASH = "–"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return None if math.isnan(v) or math.isinf(v) else float(v)


def slug(name: str) -> str:
    """A name as a file-name part: non-alphanumerics become dashes."""
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


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
        ceiling = _num((block.get("ceiling") or {}).get("hit_rate"))
        rows = [compare_row(name, s) for name, s in block.get("setups", {}).items()]
        header = list(COMPARE_HEADER)
        if ceiling is not None:
            header.insert(2, "÷ ceiling")
            for row, s in zip(rows, block.get("setups", {}).values(), strict=True):
                hit = _num(s.get("hit_rate"))
                row.insert(2, fmt(hit / ceiling if hit is not None and ceiling else None))
        out.append("TTFT/E2E in ms.\n")
        out.append(table(header, rows))
        if ceiling is not None:
            c = block["ceiling"]
            out.append(f"One-cache ceiling (the same {c.get('requests')} requests through one "
                       f"cache of {c.get('num_blocks')} blocks, the fleet's total): hit rate "
                       f"{pct(ceiling)}.\n")
        decided = {name: s["router_branches"] for name, s in block.get("setups", {}).items()
                   if s.get("router_branches")}
        if decided:
            out.append("Router decisions (its `prefix_router_requests_total` by branch): " + "; ".join(
                f"{name}: " + ", ".join(f"{b} {n}" for b, n in br.items())
                for name, br in decided.items()) + ".\n")
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


# -- targets --------------------------------------------------------------------------------------
def _verdict(ok: bool | None) -> str:
    return DASH if ok is None else ("met" if ok else "**missed**")


def _pct2(v: float | None) -> str:
    return DASH if v is None else f"{100 * v:.2f}%"


def _joint(c: Cell) -> str:
    """The hit bound at MAX_LOAD against sglang's measured hit rate (`Cell.joint_ok`)."""
    if c.bound is None:
        return DASH
    ok = c.joint_ok
    if ok is None:
        return _pct2(c.bound)
    if ok:
        return f"{_pct2(c.bound)} ≥ {_pct2(c.sglang_hit)}: not ruled out"
    return (f"{_pct2(c.bound)} < {_pct2(c.sglang_hit)}: **both targets cannot be met together "
            "(any router)**")


def targets_markdown(cells: Sequence[Cell]) -> str:
    """Issue #18's targets per cell (`loadtest.targets.cells`), then the geometric means."""
    lines = []
    for c in cells:
        lines.append([
            c.workload, DASH if c.replicas is None else str(c.replicas),
            f"{pct(c.hit)} vs {pct(c.sglang_hit)}: {_verdict(c.hit_ok)}",
            fmt(c.of_ceiling),
            f"{ms(c.p99)} vs {ms(c.sglang_p99)} ({fmt(c.p99_ratio)}): {_verdict(c.p99_ok)}",
            f"{ms(c.p99)} vs {ms(c.rr_p99)}: {_verdict(c.rr_ok)}",
            f"{fmt(c.load)}: {_verdict(c.load_ok)}",
            _joint(c),
        ])
    out = [table(["workload", "replicas", "hit rate ≥ sglang cache_aware", "hit ÷ ceiling",
                  "TTFT p99 ≤ sglang (ms, ratio)", "TTFT p99 ≤ round-robin (ms)",
                  f"max/mean requests ≤ {MAX_LOAD}",
                  f"any router's hit bound at max/mean ≤ {MAX_LOAD} vs sglang"], lines,
                 ["l", "r", "l", "r", "l", "l", "l", "l"])]
    if any(c.bound is not None for c in cells):
        out.append(f"*Hit bound*: the best hit rate any router can reach on the cell's requests "
                   f"while every replica receives at most {MAX_LOAD} × the mean number of "
                   "requests (`loadtest.balance_bound.hit_bound`: a block shared by R requests is "
                   f"computed on at least ⌈R / cap⌉ replicas; capacity ignored). Below "
                   "sglang-router's measured hit rate, the two targets (hit rate ≥ sglang's, "
                   f"max/mean ≤ {MAX_LOAD}) cannot both be met on that cell, whatever the "
                   "router.\n")
    means = geomeans(cells)
    if means:
        parts = []
        for k, v in means.items():
            label = "all cells" if k == "all" else f"{k} replicas"
            ok = None if v is None else v <= GEOMEAN_P99
            parts.append(f"{label} {fmt(v)} ({_verdict(ok)})")
        out.append(f"Geometric mean of TTFT p99 ÷ sglang cache_aware's (target ≤ {GEOMEAN_P99}): "
                   + ", ".join(parts) + ".\n")
    return "\n".join(out)


def sim_targets_markdown(rows: Sequence[SimRow]) -> str:
    lines = [[r.workload, r.policy, pct(r.hit), pct(r.ceiling), fmt(r.of_ceiling),
              fmt(r.load), _verdict(r.ok)] for r in rows]
    return table(["workload", "policy", "hit rate", "ceiling", "÷ ceiling", "max/mean load",
                  f"≥ {OF_CEILING} × ceiling at max/mean ≤ {MAX_LOAD}"], lines,
                 ["l", "l", "r", "r", "r", "r", "l"])


def one_replica_setups(results: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(workload, setup, replicas) where a setup sent every request to a single replica."""
    out = []
    for wl, block in results.get("workloads", {}).items():
        for name, s in (block.get("setups") or {}).items():
            per = s.get("per_replica") or {}
            busy = [n for n, r in per.items() if (_num(r.get("requests")) or 0) > 0]
            if len(per) > 1 and len(busy) == 1:
                out.append((wl, name, len(per)))
    return out


def capacity_lines(cells: Sequence[Mapping[str, Any]], c: Mapping[str, Any]) -> list[str]:
    """The capacity cells (direct and the router kept busy), when measured."""
    if not cells:
        return []
    rows = [[str(x.get("setup")), str(x.get("mode")), str(x.get("requests")),
             fmt(x.get("throughput"), 0), fmt(_scale(x.get("cpu_per_request"), 1e6), 0)]
            for x in cells]
    return [f"Capacity cells: the same requests from a closed loop at concurrency "
            f"{c.get('concurrency')} whose client only reads each body ({c.get('capacity_requests')} "
            "per cell), so each server is busy — the cells above are paced by a client that "
            "decodes every SSE event, and a server answering one request per wake-up pays an "
            "event-loop round trip on each. The replica-capacity targets use these cells.\n",
            table(["setup", "mode", "requests", "req/s", "CPU µs/request"], rows,
                  ["l", "l", "r", "r", "r"])]


def overhead_targets_markdown(r: Mapping[str, Any]) -> str:
    """The overhead targets against `loadtest.overhead.ratios` of one run."""

    def row(label: str, target: str, value: Any, limit: float | None, scale: float = 1.0,
            digits: int = 2, at_least: bool = False) -> list[str]:
        x = _num(value)
        shown = fmt(None if x is None else x * scale, digits)
        ok = None if x is None or limit is None else (x >= limit if at_least else x <= limit)
        verdict = "" if limit is None else _verdict(ok)
        return [label, target, shown, verdict]

    rows = [
        row("router CPU/request ÷ sglang-router's", "≤ 2.0", r.get("cpu_per_request_vs_sglang"), 2.0),
        row("router CPU/chunk ÷ sglang-router's", "≤ 1.5", r.get("cpu_per_chunk_vs_sglang"), 1.5),
        row("router CPU/request ÷ nginx's", DASH, r.get("cpu_per_request_vs_nginx"), None),
        row("router CPU/chunk ÷ nginx's", DASH, r.get("cpu_per_chunk_vs_nginx"), None),
        row("router added p50, concurrency 1, non-streamed (ms)", "≤ 0.5",
            r.get("added_p50_c1_plain"), 0.0005, 1000.0, 3),
        row("router added p50, concurrency 1, streamed (ms)", "≤ 0.5",
            r.get("added_p50_c1_stream"), 0.0005, 1000.0, 3),
        row("the stack's floor (passthrough): CPU/request ÷ sglang-router's", DASH,
            r.get("passthrough_cpu_per_request_vs_sglang"), None),
        row("the stack's floor (passthrough): CPU/chunk ÷ sglang-router's", DASH,
            r.get("passthrough_cpu_per_chunk_vs_sglang"), None),
        row("the stack's floor (passthrough): added p50, concurrency 1, non-streamed (ms)", DASH,
            r.get("passthrough_added_p50_c1_plain"), None, 1000.0, 3),
        row("router CPU/request ÷ passthrough's, non-streamed (issue #18)", "≤ 1.3",
            r.get("cpu_per_request_vs_passthrough"), 1.3),
        row("router CPU/chunk ÷ passthrough's", DASH, r.get("cpu_per_chunk_vs_passthrough"), None),
        row("one instant replica's capacity ÷ the router's (router CPU/request ÷ replica's, "
            "both busy), non-streamed", "≥ 3", r.get("replica_capacity_vs_router_plain"), 3.0,
            at_least=True),
        row("one instant replica's capacity ÷ the router's, streamed", "≥ 3",
            r.get("replica_capacity_vs_router_stream"), 3.0, at_least=True),
    ]
    return table(["measure", "target", "measured", "verdict"], rows, ["l", "r", "r", "l"])
