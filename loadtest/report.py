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
OURS, SGLANG, ROUND_ROBIN = "router-prefix", "sglang-cache_aware", "router-round_robin"


def compare_targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets per workload, from one compare run (values None when not measured).

    hit rate >= sglang-router cache_aware's; TTFT p99 <= 0.8x its; max/mean load <= 1.25;
    on shared-prefix also hit rate >= 2x round-robin's.
    """
    out = []
    for wl, block in results.get("workloads", {}).items():
        setups = block.get("setups") or {}
        ours, theirs, rr = setups.get(OURS), setups.get(SGLANG), setups.get(ROUND_ROBIN)
        if ours is None:
            continue
        hit = _num(ours.get("hit_rate"))
        row: dict[str, Any] = {"workload": wl, "hit_rate": hit,
                               "load": _num(ours.get("load_max_over_mean"))}
        if theirs is not None:
            row["sglang_hit_rate"] = _num(theirs.get("hit_rate"))
            p99, sp99 = _num(ours["ttft"].get("p99")), _num(theirs["ttft"].get("p99"))
            row["ttft_p99_ratio"] = p99 / sp99 if p99 is not None and sp99 else None
        if wl == "shared-prefix" and rr is not None:
            rh = _num(rr.get("hit_rate"))
            row["hit_vs_round_robin"] = hit / rh if hit is not None and rh else None
        out.append(row)
    return out


def _verdict(ok: bool | None) -> str:
    return DASH if ok is None else ("met" if ok else "**missed**")


def targets_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for r in rows:
        hit, shit = r.get("hit_rate"), r.get("sglang_hit_rate")
        ratio, load = r.get("ttft_p99_ratio"), r.get("load")
        vs_rr = r.get("hit_vs_round_robin")
        lines.append([
            str(r["workload"]),
            f"{pct(hit)} vs {pct(shit)}: {_verdict(None if hit is None or shit is None else hit >= shit)}",
            f"{fmt(ratio)}: {_verdict(None if ratio is None else ratio <= 0.8)}",
            f"{fmt(load)}: {_verdict(None if load is None else load <= 1.25)}",
            DASH if "hit_vs_round_robin" not in r else
            f"{fmt(vs_rr)}x: {_verdict(None if vs_rr is None else vs_rr >= 2.0)}",
        ])
    return table(["workload", "hit rate ≥ sglang cache_aware", "TTFT p99 ÷ sglang ≤ 0.8",
                  "max/mean load ≤ 1.25", "hit ÷ round-robin ≥ 2"], lines,
                 ["l", "l", "l", "l", "l"])


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


def _capacity_lines(cells: Sequence[Mapping[str, Any]], c: Mapping[str, Any]) -> list[str]:
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
        row("router CPU/request ÷ passthrough's", DASH, r.get("cpu_per_request_vs_passthrough"),
            None),
        row("router CPU/chunk ÷ passthrough's", DASH, r.get("cpu_per_chunk_vs_passthrough"), None),
        row("one instant replica's capacity ÷ the router's (router CPU/request ÷ replica's, "
            "both busy), non-streamed", "≥ 3", r.get("replica_capacity_vs_router_plain"), 3.0,
            at_least=True),
        row("one instant replica's capacity ÷ the router's, streamed", "≥ 3",
            r.get("replica_capacity_vs_router_stream"), 3.0, at_least=True),
    ]
    return table(["measure", "target", "measured", "verdict"], rows, ["l", "r", "r", "l"])


# -- docs/benchmarks.md ---------------------------------------------------------------------------
def _img(figures: Mapping[str, Any], key: str, doc_dir: Any, alt: str) -> str:
    path = figures.get(key)
    if path is None:
        return ""
    import os

    return f"![{alt}]({os.path.relpath(str(path), str(doc_dir))})\n"


def _fleet_table(results: Mapping[str, Any]) -> str:
    rows = []
    for wl, block in results.get("workloads", {}).items():
        f = block.get("fleet") or results.get("fleet") or {}
        meta = block.get("workload") or {}
        rows.append([wl, str(meta.get("requests", DASH)), fmt(meta.get("rate"), 0),
                     str(f.get("replicas", DASH)), str(f.get("kv_blocks", DASH)),
                     str(f.get("max_num_seqs", DASH)), fmt(f.get("speed"), 1),
                     f"{f.get('step_ms', DASH)} ms + {f.get('prefill_us_per_token', DASH)} µs/uncached "
                     f"token + {f.get('decode_us_per_seq', DASH)} µs/seq"])
    return table(["workload", "requests", "rate/s", "replicas", "KV blocks (×16 tok)",
                  "max seqs", "speed", "step cost"], rows)


def _simulate_table(sim: Mapping[str, Any]) -> str:
    rows = []
    for r in sim.get("results", []):
        rows.append([str(r["config"]["policy"]), str(r["requests"]), pct(r["hit_rate"]),
                     ms(r["ttft"]["p50"]), ms(r["ttft"]["p99"]), fmt(r["load_max_over_mean"]),
                     fmt(r["virtual_seconds"], 1), fmt(r["wall_seconds"], 1)])
    return table(["policy", "requests", "hit rate", "TTFT p50 ms", "TTFT p99 ms", "max/mean load",
                  "virtual s", "wall s"], rows)


def benchmarks_markdown(data: Mapping[str, Any], figures: Mapping[str, Any], doc_dir: Any) -> str:
    """The whole of docs/benchmarks.md from `loadtest.bench`'s data (figure paths relative to
    ``doc_dir``)."""
    m = data.get("machine", {})
    t = data.get("timings", {})
    out = [
        "# Benchmarks\n",
        "Generated by `make bench` (`python -m loadtest.bench`); do not edit by hand - rerun it.\n",
        f"- date: {m.get('date', DASH)}",
        f"- machine: {m.get('nproc', DASH)} CPUs ({m.get('cpu', DASH)}), Python "
        f"{m.get('python', DASH)}, {m.get('platform', DASH)}",
        f"- code: commit {m.get('commit', DASH)} (other engineers were committing to the router "
        "while benchmarks ran; the numbers describe this commit)",
        f"- wall time: {fmt(t.get('total'), 0)} s (compare {fmt(t.get('compare'), 0)} s, overhead "
        f"{fmt(t.get('overhead'), 0)} s, simulate {fmt(t.get('simulate'), 0)} s)"
        + (" — **quick mode: smoke-test sizes, not a benchmark**" if data.get("quick") else ""),
        "",
        "Everything - replicas, routers, nginx, the load client - shares this machine's cores, "
        "and other jobs may be running on it. Absolute latencies are therefore noisy; compare "
        "setups *within* a table (same run, same requests, minutes apart), not across runs.\n",
    ]
    for part, why in (data.get("failed") or {}).items():
        out.append(f"- **{part} failed in this run**: `{why[:300]}`")
    if data.get("failed"):
        out.append("")
    cmp_ = data.get("compare")
    if cmp_:
        versions = cmp_.get("versions") or {}
        out += [
            "## Routing setups on the same traffic\n",
            "Method: for every workload and every setup, a fresh simulated fleet is started "
            "(cold caches, zeroed counters), the setup is started in front of it, and the *same* "
            "requests (same seed, same arrival times, open loop, streamed) are sent through it. "
            "Hit rate is the fleet's own `vllm:prefix_cache_hits_total` / "
            "`vllm:prefix_cache_queries_total` delta over the run (tokens); load is max/mean of "
            "the requests each replica received (`sim:requests_total` delta, all replicas, so an "
            "idle replica counts as 0). TTFT is the first content chunk seen by the client.\n",
            "Setups: `router-*` = this router (`prefix` = bounded-load prefix hashing, "
            "load factor 1.25); `nginx` = the generated consistent-hash config, clients send "
            "`X-Prefix-Hash` from `router.client.hash_key` (its ring hashes `host:port`, and the fleet's ports are ephemeral, so which prompts share a replica - and nginx's balance - changes from run to run); `sglang-*` = sglang-router "
            f"{versions.get('sglang-router', '(not installed)')}; `vllm-*` = vllm-router "
            f"{versions.get('vllm-router', '(not installed)')}.\n",
            "Fleet: the KV cache is deliberately small (one replica cannot hold every system "
            "prompt of a workload, as on a real GPU) and the timing model charges every uncached "
            "prompt token, so misses show up in TTFT:\n",
            _fleet_table(cmp_),
        ]
        rows = compare_targets(cmp_)
        if rows:
            out += ["### Targets (router-prefix vs the others, this run)\n", targets_markdown(rows)]
        for wl in cmp_.get("workloads", {}):
            out.append(compare_markdown({"workloads": {wl: cmp_["workloads"][wl]}}))
            failed = cmp_["workloads"][wl].get("failed") or {}
            for name, why in failed.items():
                out.append(f"- **{name}** failed: {why}\n")
            out.append(_img(figures, wl, doc_dir, f"{wl}: TTFT CDF, hit rate, load per replica"))
        single = one_replica_setups(cmp_)
        if single:
            out.append("### Setups that sent everything to one replica\n")
            for wl, name, n in single:
                out.append(f"- {wl}: `{name}` sent every request to one of the {n} replicas.")
            out.append("")
            if any(name.startswith("vllm-consistent_hash") for _, name, _n in single):
                out.append("vllm-router's `consistent_hash` keys on session/user identifiers; "
                           "these requests carry none it recognises (with INFO logging on, it "
                           "reports the same key, `request:`, for every request), so every "
                           "request hashes to one worker. Shown as measured, not worked around.\n")
            if any(name in ("nginx", "router-prefix") for _, name, _n in single):
                out.append("nginx hashes the `X-Prefix-Hash` the client computes with "
                           "`router.client.hash_key`; when every request of a workload yields "
                           "the same key (all mooncake records start with the same system-prompt "
                           "block), nginx has one key to place and no load bound, so one replica "
                           "serves everything. The router uses the same key but spills under "
                           "its load bound.\n")
    oh = data.get("overhead")
    if oh:
        c = oh.get("config", {})
        out += [
            "## Proxy overhead\n",
            f"One simulated replica in `--instant` mode (no timing model), one fixed chat "
            f"request; non-streamed answers have 16 tokens, streamed ones {c.get('chunks')} "
            f"content chunks. All setups run at once and the cells are interleaved over "
            f"{c.get('rounds')} rounds. Latency at concurrency 1 ({c.get('latency_requests')} "
            f"requests per cell); CPU at concurrency {c.get('concurrency')} "
            f"({c.get('cpu_requests')} requests per cell) = utime+stime of the proxy's process "
            "tree from /proc (10 ms ticks). *added p50* = p50 minus direct's p50 in the same "
            "mode and concurrency. CPU/chunk = CPU per streamed request / chunks per request. "
            f"Mode *paced*: token-paced streams from a second fleet whose engine emits one "
            f"token every {c.get('paced_ms')} ms to every running stream ({c.get('paced_requests')} "
            "streams per setup at the CPU concurrency); the CPU/chunk target uses these cells.\n",
            overhead_markdown(oh.get("rows", [])),
            *_capacity_lines(oh.get("capacity") or [], c),
            overhead_targets_markdown(oh.get("ratios", {})),
        ]
        for name, why in (oh.get("skipped") or {}).items():
            out.append(f"- {name} skipped: {why}")
        out.append("")
    sim = data.get("simulate")
    if sim:
        w = sim.get("workload", {})
        out += [
            f"## Fleet scale: discrete-event simulation, {w.get('replicas')} replicas\n",
            "`loadtest.simulate` runs the router's own key/ring/policy code in front of "
            f"{w.get('replicas')} copies of the simulated replica's engine in virtual time. "
            f"Workload: shared-prefix with {w.get('prompts')} system prompts, "
            f"{w.get('requests')} requests at {fmt(w.get('rate'), 0)}/s, "
            f"{w.get('kv_blocks')} KV blocks per replica.\n",
            _simulate_table(sim),
            _img(figures, "simulate", doc_dir, "simulated hit rate and TTFT per policy"),
        ]
    out += [
        "## Real vLLM\n",
        "The same comparison on two real vLLM (CPU) replicas serving a tiny random-weight Llama, "
        "caches emptied between setups, hit rate from vLLM's own counters: "
        "[benchmarks-vllm.md](benchmarks-vllm.md) (`make bench-vllm`, ~7 min).\n",
        "## Reproduce\n",
        "```",
        "make bench                                   # this page and docs/img/bench-*.png",
        "python -m loadtest.bench --quick             # smoke run of the whole pipeline (~2 min)",
        "prefix-loadtest compare --workload shared-prefix --replicas 4 --plots /tmp/plots",
        "prefix-loadtest overhead --out /tmp/overhead.json",
        "prefix-loadtest run --target http://127.0.0.1:8000 --workload hot-prefix --rate 10 \\",
        "    --requests 200 --router-config router.yaml --out results.json",
        "```",
        "",
        "Raw results (every summary, TTFT samples): `build/bench/bench.json`. sglang-router and "
        "vllm-router come from the optional extra `pip install 'prefix-router[compare]'`; "
        "without them their rows are skipped with a note.",
    ]
    return "\n".join(out).rstrip() + "\n"
