"""`python -m loadtest.bench_kv`: precise routing (the replicas' KV events) side by side with the
other setups; writes the ``kv-events`` block of docs/benchmarks.md (`loadtest.doc_blocks`, so
`make bench` keeps it).

Cells (4 simulated replicas, the compare fleet's constrained KV cache and timing model, every
replica publishing KV events - for every setup, so they all pay the publisher's CPU):

- ``cache-pressure`` (modelled on llm-d's precise-prefix benchmark: many groups of long shared
  prefixes): ``--groups`` system prompts of 2,500-3,500 tokens with uniform popularity, each
  request one of them plus a question and ~50 pasted tokens; the prefixes total about 1.5x the
  fleet's KV capacity, so which replica still holds which prefix - evictions - decides;
- three `make bench` cells: shared-prefix, multi-turn, rag (`loadtest.cells.WORKLOADS`).

Setups, each in front of a fresh fleet: ``router-cache_aware+kv`` (precise), ``router-
cache_aware`` (approximate), ``router-prefix``, ``router-round_robin``, ``sglang-cache_aware``;
on cache-pressure also 1, 2 and 4 precise router processes behind the round-robin splitter and
sglang-router x2. Per run: the fleet's own hit rate (token counters), the client's TTFT, the
router processes' CPU seconds per request (/proc schedstat of their PIDs) and, for the router,
its predicted and the replicas' reported cached tokens (its /metrics).

Cost: per setup one fleet start, one setup start and the run (8-20 s of traffic); about 8
minutes on 2 cores. Run it under ``flock /work/.bench.lock``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest.cells import WORKLOADS, BenchWorkload, cell_requests
from loadtest.compare import FleetParams, machine_info
from loadtest.doc_blocks import replace_block
from loadtest.fleet import Fleet
from loadtest.runner import Plan, run
from loadtest.setups import (
    Launched,
    SetupError,
    cpu_seconds,
    launch,
    parse_setup,
    tiny_tokenizer_dir,
)

__all__ = ["BLOCK", "CACHE_PRESSURE", "SETUPS", "SPLIT", "main", "render"]

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "kv-events"
SETUPS = ("router-cache_aware+kv", "router-cache_aware", "router-prefix", "router-round_robin",
          "sglang-cache_aware")
SPLIT = ("router-cache_aware-x1+kv", "router-cache_aware-x2+kv", "router-cache_aware-x4+kv",
         "sglang-cache_aware-x2")
CACHE_PRESSURE = BenchWorkload(
    "cache-pressure", 240, 10.0, FleetParams(kv_events=True),
    {"prompts": 24, "min_prompt_tokens": 2500, "max_prompt_tokens": 3500, "zipf_s": 0.0,
     "user_tokens": 50})
OTHERS = ("shared-prefix", "multi-turn", "rag")

_COUNTER = re.compile(r"^(prefix_router_(?:predicted|reported)_cached_tokens_total)\{[^}]*\}"
                      r"\s+(\S+)", re.M)


def _cached_counters(url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for name, value in _COUNTER.findall(text):
        key = name.split("_")[2]
        out[key] = out.get(key, 0.0) + float(value)
    return out


def _pids(launched: Launched) -> list[int]:
    procs = launched.parts or [launched]
    return [p.pid for p in procs if p.pid is not None]


def run_cell(w: BenchWorkload, setups: list[str], workdir: Path, seed: int,
             tokenizer_dir: Path) -> dict[str, Any]:
    reqs, meta = cell_requests(w, seed, workdir / w.name)
    plan = Plan("http://unused", rate=w.rate, max_requests=len(reqs), max_time=120.0)
    cell: dict[str, Any] = {"workload": meta, "fleet": {"replicas": w.fleet.replicas,
                                                        "kv_blocks": w.fleet.kv_blocks},
                            "setups": {}, "failed": {}}
    for name in setups:
        setup = parse_setup(name)
        if setup.unavailable():
            cell["failed"][name] = setup.unavailable()
            continue
        fleet = Fleet(replicas=w.fleet.replicas, model_path=str(tokenizer_dir),
                      log_dir=str(workdir / w.name / name / "fleet"),
                      **w.fleet.replica_options())
        fleet.start()
        t = time.monotonic()
        try:
            replicas = [(n, u, e or "", r or "") for n, u, e, r in zip(
                fleet.names, fleet.urls, fleet.kv_endpoints, fleet.kv_replay_endpoints,
                strict=True)]
            with launch(setup, replicas, workdir / w.name / name) as launched:
                pids = _pids(launched)
                cpu0 = sum(cpu_seconds(p) for p in pids)
                p = replace(plan, target=launched.url, replica_urls=tuple(fleet.urls),
                            progress_label=name)
                result = run(p, reqs, meta)
                cpu = sum(cpu_seconds(p) for p in pids) - cpu0
                counters: dict[str, float] = {}
                if setup.kind == "router":
                    for part in launched.parts or [launched]:
                        for k, v in _cached_counters(part.url).items():
                            counters[k] = counters.get(k, 0.0) + v
        except (SetupError, OSError) as exc:
            cell["failed"][name] = " ".join(str(exc).split())[:300]
            print(f"[{w.name}] {name}: FAILED {exc}", file=sys.stderr, flush=True)
            continue
        finally:
            fleet.stop()
        s = result.summary()
        row = {"hit_rate": s["hit_rate"], "ttft": s["ttft"], "ok": s["ok"],
               "errors": s["error_count"], "output_token_throughput":
               s["output_token_throughput"], "load_max_over_mean": s["load_max_over_mean"],
               "router_cpu_per_request_us": cpu / max(1, s["sent"]) * 1e6, **counters}
        cell["setups"][name] = row
        print(f"[{w.name}] {name}: hit {row['hit_rate']:.3f} ttft p50 {s['ttft']['p50']:.3f} "
              f"p90 {s['ttft']['p90']:.3f} cpu/req {row['router_cpu_per_request_us']:.0f} µs "
              f"({time.monotonic() - t:.0f}s)", file=sys.stderr, flush=True)
    return cell


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.0f}"


def render(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [f"<!-- {BLOCK}:begin -->", "## Precise routing from KV events", "",
             f"`python -m loadtest.bench_kv` at {m['commit']}, {m['date']}, {m['nproc']} cores, one "
             "run, every setup on a fresh fleet of 4 simulated replicas that publish vLLM's KV "
             "events (768 blocks of 16 tokens each, 1,024 on rag). `router-cache_aware+kv` is "
             "precise routing (`routing.kv_events`), `router-cache_aware` the approximate index. "
             "Hit rate: the replicas' own token counters; TTFT: the client's first token; CPU: "
             "the router processes' on-CPU time per request (/proc schedstat); predicted / "
             "reported: the router's `prefix_router_predicted_cached_tokens_total` over the "
             "replicas' reported `cached_tokens`.", ""]
    for key, cell in data["cells"].items():
        wl = cell["workload"]
        lines += [f"**{key}** ({wl.get('requests')} requests at {wl.get('rate')}/s"
                  + (f", {wl['prompts']} groups of {wl['min_prompt_tokens']:,}-"
                     f"{wl['max_prompt_tokens']:,}-token prefixes, uniform"
                     if key == "cache-pressure" else "") + ")", "",
                  "| setup | hit rate | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | output tok/s "
                  "| router CPU µs/req | predicted / reported |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r in cell["setups"].items():
            pr = (f"{r['predicted'] / r['reported']:.3f}" if r.get("reported") else "-")
            lines.append(f"| {name} | {r['hit_rate']:.1%} | {_ms(r['ttft']['p50'])} | "
                         f"{_ms(r['ttft']['p90'])} | {_ms(r['ttft']['p99'])} | "
                         f"{r['output_token_throughput']:,.0f} | "
                         f"{r['router_cpu_per_request_us']:,.0f} | {pr} |")
        for name, why in cell["failed"].items():
            lines.append(f"| {name} | failed: {why} | | | | | | |")
        lines.append("")
    lines += data.get("verdicts", []) + ["", f"<!-- {BLOCK}:end -->", ""]
    return "\n".join(lines)


def verdicts(data: dict[str, Any]) -> list[str]:
    out = []
    cp = data["cells"].get("cache-pressure", {}).get("setups", {})
    precise, sg = cp.get("router-cache_aware+kv"), cp.get("sglang-cache_aware")
    if precise and sg:
        ratio = precise["ttft"]["p90"] / sg["ttft"]["p90"]
        gain = (precise["hit_rate"] - sg["hit_rate"]) * 100
        out.append(f"- cache-pressure: precise TTFT p90 {ratio:.2f}x sglang-router's (target "
                   f"<= 0.5: {'met' if ratio <= 0.5 else 'not met'}), hit rate "
                   f"{gain:+.1f} points (target >= +5: {'met' if gain >= 5 else 'not met'}).")
    for key, cell in data["cells"].items():
        s = cell["setups"]
        a, p = s.get("router-cache_aware"), s.get("router-cache_aware+kv")
        if a and p and key != "cache-pressure":
            out.append(f"- {key}: precise hit {p['hit_rate']:.1%} vs approximate "
                       f"{a['hit_rate']:.1%}, TTFT p90 {_ms(p['ttft']['p90'])} vs "
                       f"{_ms(a['ttft']['p90'])} ms.")
    one = cp.get("router-cache_aware-x1+kv")
    for n in (2, 4):
        many = cp.get(f"router-cache_aware-x{n}+kv")
        if one and many:
            d = (many["hit_rate"] - one["hit_rate"]) * 100
            out.append(f"- {n} precise routers behind the splitter: hit rate {d:+.1f} points vs "
                       f"one (target: within 1: {'met' if abs(d) <= 1 else 'not met'}).")
    sg2 = cp.get("sglang-cache_aware-x2")
    if sg and sg2:
        out.append(f"- sglang-router x2: hit rate {(sg2['hit_rate'] - sg['hit_rate']) * 100:+.1f} "
                   "points vs one.")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_kv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "bench_kv.json"))
    ap.add_argument("--quick", action="store_true", help="one small cell, two setups (smoke)")
    ap.add_argument("--no-split", action="store_true", help="skip the multi-router runs")
    ap.add_argument("--cells", default=",".join(("cache-pressure", *OTHERS)))
    args = ap.parse_args(argv)
    names = args.cells.split(",")
    cells: list[BenchWorkload] = []
    for name in names:
        if name == "cache-pressure":
            cells.append(CACHE_PRESSURE)
        else:
            w = next(w for w in WORKLOADS if w.name == name)
            cells.append(replace(w, fleet=replace(w.fleet, kv_events=True)))
    if args.quick:
        cells = [replace(cells[0], requests=30)]
    data: dict[str, Any] = {"machine": machine_info(), "cells": {}}
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as tmp:
        workdir = Path(tmp)
        tok = tiny_tokenizer_dir(workdir / "tokenizer")
        for w in cells:
            setups = list(SETUPS[:2] if args.quick else SETUPS)
            if w.name == "cache-pressure" and not args.quick and not args.no_split:
                setups += SPLIT
            data["cells"][w.name] = run_cell(w, setups, workdir, args.seed, tok)
    data["verdicts"] = verdicts(data)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1, default=str))
    block = render(data)
    doc = Path(args.doc)
    doc.write_text(replace_block(doc.read_text() if doc.exists() else "", BLOCK, block))
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
