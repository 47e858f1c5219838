"""`prefix-loadtest overhead`: what a proxy costs per request, measured side by side in one run.

Fleet: simulated replicas in ``--instant`` mode (no timing model: a reply is as fast as the
replica's Python can produce it), so what differs between setups is the proxy. One fixed chat
body with a ~1.5k-character system prompt; non-streamed answers carry 16 tokens, streamed ones
``--chunks`` (64) content chunks.

All setups (``direct`` = no proxy, the router, nginx, sglang-router) run at once in front of
one fleet, and the measurements are interleaved in rounds (every setup's cell, then the next
round), so slow drift in the shared machine's load falls on every setup alike. Per setup and mode
(non-streamed, streamed) two closed-loop cells:

* concurrency 1 (``--latency-requests``): client-side E2E p50/p99; *added p50* = the setup's p50
  minus direct's p50 in the same mode (same run, same machine, minutes apart);
* concurrency ``--concurrency`` (``--cpu-requests``): proxy CPU = utime+stime of the proxy's
  process tree (``/proc/<pid>/stat``, nginx workers included) after minus before, divided by
  requests (CPU/request) and, streamed, by relayed content chunks (CPU/chunk = CPU per streamed
  request / chunks per request; an upper bound on the marginal per-chunk cost).

Ratios against sglang-router are computed from the same run (`ratios`). CPU time has 10 ms
resolution (clock ticks), so the CPU runs are sized to use at least a few seconds of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.fleet import Fleet
from loadtest.runner import Plan, run
from loadtest.setups import Launched, Setup, SetupError, cpu_seconds, launch, parse_setup
from loadtest.stats import summarize
from loadtest.workloads import CHAT, Request, synthetic_text

__all__ = ["DEFAULT_SETUPS", "OverheadConfig", "add_arguments", "main", "measure", "ratios"]

DEFAULT_SETUPS = ("direct", "router-prefix", "nginx", "sglang-cache_aware")


@dataclass(frozen=True)
class OverheadConfig:
    replicas: int = 1
    concurrency: int = 16
    latency_requests: int = 300
    cpu_requests: int = 1500
    chunks: int = 64
    rounds: int = 3
    max_time: float = 120.0


def _requests(n: int, stream: bool, max_tokens: int) -> list[Request]:
    import random

    system = "You are the ACME help desk assistant.\n" + synthetic_text(random.Random(7), 260)
    body: dict[str, Any] = {"model": "sim-model", "max_tokens": max_tokens, "temperature": 0,
                            "stream": stream,
                            "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": "How do I reset my password?"}]}
    return [Request(i, 0.0, CHAT, body, group="fixed") for i in range(n)]


@dataclass
class _Acc:
    """Samples of one (setup, mode, concurrency) cell, gathered over the rounds."""

    e2e: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    tokens: int = 0
    cpu: float | None = 0.0
    wall: float = 0.0


def _round(launched: Launched, setup: Setup, stream: bool, concurrency: int, n: int,
           cfg: OverheadConfig, acc: _Acc) -> None:
    reqs = _requests(n, stream, cfg.chunks if stream else 16)
    plan = Plan(launched.url, concurrency=concurrency, max_requests=n, max_time=cfg.max_time,
                stream=stream, prefix_hash_header=setup.prefix_hash_header,
                progress_label=f"{setup.name} {'stream' if stream else 'plain'} c={concurrency}")
    pid = launched.pid
    cpu0 = cpu_seconds(pid) if pid else None
    result = run(plan, reqs)
    cpu1 = cpu_seconds(pid) if pid else None
    for o in result.outcomes:
        if o.ok and o.e2e is not None:
            acc.ok += 1
            acc.e2e.append(o.e2e)
            acc.ttft.append(o.ttft if o.ttft is not None else o.e2e)
            acc.tokens += o.output_tokens
        else:
            acc.errors += 1
    acc.wall += result.wall_seconds
    if cpu0 is None or cpu1 is None or acc.cpu is None:
        acc.cpu = None
    else:
        acc.cpu += cpu1 - cpu0


def _row(setup: str, stream: bool, concurrency: int, acc: _Acc) -> dict[str, Any]:
    chunks = acc.tokens / acc.ok if acc.ok else 0.0
    per_req = acc.cpu / acc.ok if acc.cpu is not None and acc.ok else None
    return {"setup": setup, "mode": "stream" if stream else "plain",
            "concurrency": concurrency, "requests": acc.ok, "errors": acc.errors,
            "latency": summarize(acc.e2e), "ttft": summarize(acc.ttft),
            "throughput": acc.ok / acc.wall if acc.wall else None,
            "cpu_seconds": acc.cpu, "cpu_per_request": per_req,
            "cpu_per_chunk": per_req / chunks if per_req is not None and stream and chunks else None,
            "chunks_per_request": chunks}


def measure(setups: Sequence[Setup], cfg: OverheadConfig, workdir: Path,
            log: Any = None) -> dict[str, Any]:
    """All setups run at once in front of one fleet; the cells are interleaved in
    ``cfg.rounds`` rounds so drift in the machine's background load hits every setup alike."""
    skipped: dict[str, str] = {}
    cells = [(stream, conc, n) for stream in (False, True)
             for conc, n in ((1, cfg.latency_requests), (cfg.concurrency, cfg.cpu_requests))]
    accs: dict[tuple[str, bool, int], _Acc] = {}
    fleet = Fleet(replicas=cfg.replicas, instant=True, log_dir=str(workdir / "fleet"))
    fleet.start()
    running: list[tuple[Setup, Launched]] = []
    try:
        replicas = list(zip(fleet.names, fleet.urls, strict=True))
        for setup in setups:
            reason = setup.unavailable()
            if reason:
                skipped[setup.name] = reason
                continue
            try:
                running.append((setup, launch(setup, replicas, workdir / setup.name)))
            except SetupError as exc:
                skipped[setup.name] = f"failed to start: {str(exc).splitlines()[0]}"
        for r in range(cfg.rounds):
            for stream, conc, n in cells:
                for setup, launched in running:
                    acc = accs.setdefault((setup.name, stream, conc), _Acc())
                    _round(launched, setup, stream, conc, max(1, n // cfg.rounds), cfg, acc)
            if log:
                log(f"overhead: round {r + 1}/{cfg.rounds} done")
    finally:
        for _, launched in running:
            launched.stop()
        fleet.stop()
    rows = [_row(setup.name, stream, conc, accs[(setup.name, stream, conc)])
            for setup, _ in running for stream, conc, _n in cells
            if (setup.name, stream, conc) in accs]
    _added(rows)
    return {"config": asdict(cfg), "rows": rows, "skipped": skipped, "ratios": ratios(rows)}


def _added(rows: list[dict[str, Any]]) -> None:
    base = {(r["mode"], r["concurrency"]): r["latency"]["p50"] for r in rows
            if r["setup"] == "direct"}
    for r in rows:
        b = base.get((r["mode"], r["concurrency"]))
        r["added_p50"] = None if b is None else r["latency"]["p50"] - b


def _find(rows: Sequence[Mapping[str, Any]], prefix: str, mode: str,
          concurrency: int | None = None) -> Mapping[str, Any] | None:
    for r in rows:
        if (str(r["setup"]).startswith(prefix) and r["mode"] == mode
                and (concurrency is None or r["concurrency"] == concurrency)):
            return r
    return None


def ratios(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Router vs sglang-router (and nginx), from the high-concurrency CPU runs of one run."""
    conc = max((int(r["concurrency"]) for r in rows), default=1)
    out: dict[str, Any] = {}
    for other in ("sglang", "nginx"):
        for key, mode in (("cpu_per_request", "plain"), ("cpu_per_chunk", "stream")):
            mine, theirs = _find(rows, "router", mode, conc), _find(rows, other, mode, conc)
            if mine and theirs and mine.get(key) and theirs.get(key):
                out[f"{key}_vs_{other}"] = mine[key] / theirs[key]
    for mode in ("plain", "stream"):
        r = _find(rows, "router", mode, 1)
        if r is not None:
            out[f"added_p50_c1_{mode}"] = r.get("added_p50")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    c = OverheadConfig()
    p.add_argument("--setup", action="append", default=None,
                   help=f"repeatable; default: {', '.join(DEFAULT_SETUPS)} (direct is the baseline)")
    p.add_argument("--replicas", type=int, default=c.replicas)
    p.add_argument("--concurrency", type=int, default=c.concurrency)
    p.add_argument("--latency-requests", type=int, default=c.latency_requests)
    p.add_argument("--cpu-requests", type=int, default=c.cpu_requests)
    p.add_argument("--chunks", type=int, default=c.chunks)
    p.add_argument("--rounds", type=int, default=c.rounds)
    p.add_argument("--out", help="JSON results")
    p.add_argument("--workdir", help="logs and configs (default: a temp dir)")


def main(args: argparse.Namespace) -> int:
    from loadtest.report import overhead_markdown, overhead_targets_markdown

    names = args.setup or list(DEFAULT_SETUPS)
    if "direct" not in names:
        names = ["direct", *names]
    try:
        setups = [parse_setup(s) for s in names]
    except ValueError as exc:
        print(f"prefix-loadtest overhead: {exc}", file=sys.stderr)
        return 2
    cfg = OverheadConfig(replicas=args.replicas, concurrency=args.concurrency,
                         latency_requests=args.latency_requests, cpu_requests=args.cpu_requests,
                         chunks=args.chunks, rounds=args.rounds)
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        res = measure(setups, cfg, Path(args.workdir or tmp),
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(overhead_markdown(res["rows"]))
    print(overhead_targets_markdown(res["ratios"]))
    for name, why in res["skipped"].items():
        print(f"- {name} skipped: {why}")
    return 0
