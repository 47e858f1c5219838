"""`prefix-loadtest compare`: the same traffic through several routing setups, side by side.

For every workload and every setup, in that order:

1. start a fresh simulated fleet (``loadtest.fleet.Fleet``, same parameters every time) so each
   setup begins with cold caches and zeroed counters;
2. start the setup (``loadtest.setups.launch``) in front of it;
3. drive the *same* request list (same workload, same seed, same arrival times) through it with
   the runner, scraping every replica before and after;
4. stop the setup, then the fleet (by PID).

Each workload also gets its one-cache ceiling (`loadtest.ceiling.fleet_ceiling`: the same
requests through one cache of the fleet's total KV capacity), the best hit rate any router could
reach on that fleet.

A setup whose software is missing is skipped with its reason; one that fails to start or crashes
is reported as failed and the comparison goes on. Output: a markdown table per workload
(`loadtest.report.compare_markdown`), JSON (summaries plus the raw TTFT samples the CDF plots
need) and, with ``--plots DIR``, PNGs (`loadtest.plots`).

Fleet defaults (`FleetParams`) make the KV cache a constrained resource, as on a real GPU: 768
blocks of 16 tokens = 12,288 tokens per replica, while the shared-prefix workload's 8 system
prompts total ~20k tokens - one replica cannot keep them all, 4 replicas with prefix affinity
can. The timing model (10 ms/step + 100 µs per uncached prompt token + 250 µs per running
sequence) makes a miss on a 3k-token prompt cost ~0.3 s of prefill, so misses show in TTFT.

Cost: per (workload, setup) one fleet start (~1-2 s), one setup start (1-5 s) and the run.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loadtest._net import http_get
from loadtest.ceiling import fleet_ceiling
from loadtest.fleet import Fleet, FleetError
from loadtest.runner import Plan, RunResult, add_workload_arguments, run, workload_spec
from loadtest.setups import (
    Launched,
    Setup,
    SetupError,
    launch,
    parse_setup,
    tiny_tokenizer_dir,
)
from loadtest.workloads import Request, generate

KV_EVENTS_CONFIG = json.dumps({"enable_kv_cache_events": True, "topic": "kv",
                               "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"})

__all__ = ["DEFAULT_SETUPS", "FleetParams", "KV_EVENTS_CONFIG", "add_arguments", "compare",
           "machine_info", "main", "metrics_text", "plan_for", "setup_on_fleet"]

DEFAULT_SETUPS = ("router-prefix", "router-round_robin", "router-least_loaded", "nginx",
                  "sglang-cache_aware", "sglang-round_robin", "vllm-consistent_hash",
                  "vllm-cache_aware")


@dataclass(frozen=True)
class FleetParams:
    replicas: int = 4
    kv_blocks: int = 768
    block_size: int = 16
    max_num_seqs: int = 64
    speed: float = 1.0
    step_ms: float = 10.0
    prefill_us_per_token: float = 100.0
    decode_us_per_seq: float = 250.0
    # every replica publishes vLLM's KV-cache events (PUB and replay ports the kernel hands
    # out, topic "kv"), which ``router-<policy>+kv`` setups subscribe to
    kv_events: bool = False

    def replica_options(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("replicas")
        if d.pop("kv_events"):
            d["kv_events_config"] = KV_EVENTS_CONFIG
        return d


def machine_info() -> dict[str, Any]:
    import os

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform(), "commit": _commit()}


def _commit() -> str:
    """The code under test: HEAD, plus "+dirty" when tracked files differ from it."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, text=True, capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("sglang-router", "smg", "vllm-router", "aiohttp", "uvicorn"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_BRANCH = re.compile(r'^prefix_router_requests_total\{[^}]*branch="([^"]+)"[^}]*\}\s+(\S+)', re.M)


def router_branches(metrics_text: str) -> dict[str, int]:
    """Requests per routing branch (home, spill, ...) from the router's own /metrics."""
    out: dict[str, int] = {}
    for branch, value in _BRANCH.findall(metrics_text):
        out[branch] = out.get(branch, 0) + int(float(value))
    return dict(sorted(out.items()))


def metrics_text(url: str, timeout: float = 5.0) -> str:
    """The body of ``GET {url}/metrics``; OSError if it does not answer 200."""
    got = http_get(url + "/metrics", timeout)
    if got is None or got[0] != 200:
        raise OSError(f"{url}/metrics: {'no answer' if got is None else f'status {got[0]}'}")
    return got[1].decode()


def scrape_branches(router_url: str, timeout: float = 5.0) -> dict[str, int]:
    """`router_branches` of ``GET {router_url}/metrics``; OSError if it does not answer."""
    return router_branches(metrics_text(router_url, timeout))


def _branches_or_empty(url: str) -> dict[str, int]:
    try:
        return scrape_branches(url)
    except (OSError, ValueError):
        return {}


@contextmanager
def setup_on_fleet(setup: Setup, fleet_params: FleetParams, workdir: Path,
                   tokenizer_dir: Path) -> Iterator[tuple[Fleet, Launched]]:
    """A cold fleet (fresh caches, zeroed counters) with ``setup`` started in front of it; on
    exit the setup, then the fleet, are stopped (by PID)."""
    fleet = Fleet(replicas=fleet_params.replicas, model_path=str(tokenizer_dir),
                  log_dir=str(workdir / "fleet"), **fleet_params.replica_options())
    fleet.start()
    try:
        replicas: list[tuple[str, ...]] = list(zip(fleet.names, fleet.urls, strict=True))
        if fleet_params.kv_events:
            replicas = fleet.kv_replicas
        with launch(setup, replicas, workdir) as launched:
            yield fleet, launched
    finally:
        fleet.stop()


def plan_for(plan: Plan, setup: Setup, fleet: Fleet, launched: Launched) -> Plan:
    """``plan`` aimed at ``launched`` (scraping ``fleet``'s replicas before and after)."""
    return replace(plan, target=launched.url, prefix_hash_header=setup.prefix_hash_header,
                   replica_urls=tuple(fleet.urls), progress_label=setup.name)


def run_setup(setup: Setup, requests: Sequence[Request], plan: Plan, fleet_params: FleetParams,
              workdir: Path, tokenizer_dir: Path,
              workload_meta: dict[str, Any]) -> tuple[RunResult, list[dict[str, int]]]:
    """One cold fleet, one setup, one run; everything it started is stopped before it returns.
    Also returns each router process's branch counts (none for other setups): the routers start
    fresh, so their counters are this run's decisions."""
    with setup_on_fleet(setup, fleet_params, workdir, tokenizer_dir) as (fleet, launched):
        result = run(plan_for(plan, setup, fleet, launched), requests, workload_meta)
        if setup.kind != "router":
            return result, []
        return result, [_branches_or_empty(u) for u in launched.urls]


def compare(workloads: dict[str, tuple[list[Request], dict[str, Any]]], setups: Sequence[Setup],
            plan: Plan, fleet_params: FleetParams, workdir: Path, log: Log = _stderr,
            keep_outcomes: bool = False) -> dict[str, Any]:
    """Run every setup on every workload; returns the JSON-shaped results."""
    tokenizer_dir = tiny_tokenizer_dir(workdir / "tokenizer")
    out: dict[str, Any] = {"machine": machine_info(), "versions": _versions(),
                           "fleet": asdict(fleet_params),
                           "plan": {"rate": plan.rate, "concurrency": plan.concurrency,
                                    "duration": plan.duration, "max_requests": plan.max_requests,
                                    "max_time": plan.max_time, "stream": plan.stream},
                           "workloads": {}}
    for wl_name, (requests, meta) in workloads.items():
        block: dict[str, Any] = {"workload": meta, "setups": {}, "ttft": {}, "per_replica": {},
                                 "skipped": {}, "failed": {}}
        sent = requests[: plan.max_requests] if plan.max_requests is not None else requests
        block["ceiling"] = fleet_ceiling(sent, fleet_params.replicas, fleet_params.kv_blocks,
                                         fleet_params.block_size).to_json()
        log(f"[{wl_name}] one-cache ceiling: hit {block['ceiling']['hit_rate']:.3f}")
        out["workloads"][wl_name] = block
        for setup in setups:
            reason = setup.unavailable()
            if reason:
                block["skipped"][setup.name] = reason
                log(f"[{wl_name}] {setup.name}: skipped ({reason})")
                continue
            t = time.monotonic()
            try:
                result, branches = run_setup(setup, requests, plan, fleet_params,
                                             workdir / wl_name / setup.name, tokenizer_dir, meta)
            except (SetupError, FleetError, OSError) as exc:
                block["failed"][setup.name] = " ".join(str(exc).split())[:300]
                log(f"[{wl_name}] {setup.name}: FAILED {exc}")
                continue
            data = result.to_json(outcomes=keep_outcomes)
            s = data["summary"]
            if any(branches):
                total: dict[str, int] = {}
                for per in branches:
                    for b, n in per.items():
                        total[b] = total.get(b, 0) + n
                s["router_branches"] = dict(sorted(total.items()))
            if len(branches) > 1:  # requests each router process decided (the splitter's spread)
                s["router_processes"] = [sum(per.values()) for per in branches]
            block["setups"][setup.name] = s
            block["ttft"][setup.name] = sorted(o.ttft for o in result.outcomes
                                               if o.ok and o.ttft is not None)
            if keep_outcomes:
                block.setdefault("outcomes", {})[setup.name] = data["outcomes"]
            log(f"[{wl_name}] {setup.name}: hit {_f(s['hit_rate'])} ttft p50 {_f(s['ttft']['p50'])}"
                f" p99 {_f(s['ttft']['p99'])} max/mean {_f(s['load_max_over_mean'])} errors "
                f"{s['error_count']} ({time.monotonic() - t:.0f}s)")
    return out


def _f(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


# -- CLI -------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", action="append", required=True,
                   help="workload name or JSONL file (repeatable)")
    p.add_argument("--setup", action="append", default=None,
                   help=f"setup to compare (repeatable; default: {', '.join(DEFAULT_SETUPS)})")
    p.add_argument("--requests", type=int, default=200, help="requests per workload")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None, help="open loop arrivals/s (default 12)")
    load.add_argument("--concurrency", type=int, default=None, help="closed loop workers")
    p.add_argument("--max-time", type=float, default=120.0, help="hard deadline per run (s)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    fp = FleetParams()
    g = p.add_argument_group("fleet (restarted cold for every setup)")
    g.add_argument("--replicas", type=int, default=fp.replicas)
    g.add_argument("--kv-blocks", type=int, default=fp.kv_blocks)
    g.add_argument("--max-num-seqs", type=int, default=fp.max_num_seqs)
    g.add_argument("--speed", type=float, default=fp.speed)
    p.add_argument("--out", help="JSON results")
    p.add_argument("--markdown", help="markdown tables (default: stdout)")
    p.add_argument("--plots", help="directory for PNG plots")
    p.add_argument("--workdir", help="logs and configs (default: a temp dir)")
    add_workload_arguments(p)


def build_workloads(args: argparse.Namespace, names: Sequence[str], requests: int, rate: float,
                    stream: bool) -> dict[str, tuple[list[Request], dict[str, Any]]]:
    out = {}
    for name in names:
        spec = workload_spec(args, name, requests, rate, stream)
        reqs = generate(spec)
        meta = {"name": name, "requests": len(reqs), "seed": spec.seed}
        if name == "mooncake":
            meta["max_output_tokens"] = spec.max_output_tokens
        else:
            meta.update(prompts=spec.prompts, max_tokens=spec.max_tokens)
        out[name] = (reqs, meta)
    return out


def main(args: argparse.Namespace) -> int:
    from loadtest.report import compare_markdown

    try:
        setups = [parse_setup(s) for s in (args.setup or DEFAULT_SETUPS)]
        rate = args.rate if args.rate is not None or args.concurrency else 12.0
        plan = Plan("http://unused", rate=rate, concurrency=args.concurrency,
                    max_requests=args.requests, max_time=args.max_time, stream=args.stream)
        workloads = build_workloads(args, args.workload, args.requests, rate or 12.0, args.stream)
    except (ValueError, OSError) as exc:
        print(f"prefix-loadtest compare: {exc}", file=sys.stderr)
        return 2
    params = FleetParams(replicas=args.replicas, kv_blocks=args.kv_blocks,
                         max_num_seqs=args.max_num_seqs, speed=args.speed)
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        results = compare(workloads, setups, plan, params, Path(args.workdir or tmp))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.plots:
        from loadtest.plots import compare_plots

        compare_plots(results, Path(args.plots))
    md = compare_markdown(results)
    if args.markdown:
        Path(args.markdown).write_text(md)
    else:
        print(md)
    return 0
