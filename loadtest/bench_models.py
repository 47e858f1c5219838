"""`python -m loadtest.bench_models`: a mixed-model workload through model-aware and model-blind
routing, side by side; writes docs/benchmarks-models.md.

Fleet (`loadtest.fleet.Fleet.mixed`): ``llama`` on 2 replicas with LoRA adapters ``sql`` and
``support`` on both (``--max-lora 1``: a step holds one adapter, switching costs
``--lora-load-ms``), ``qwen`` on 2 replicas; the compare fleet's constrained KV cache and timing
model (`loadtest.compare.FleetParams`), so misses and adapter swaps show in TTFT.

Traffic: one shared-prefix workload per model (its own system prompts, Poisson arrivals),
merged by arrival time into one open-loop run - the same requests for every setup.

Setups, each in front of a fresh fleet (cold caches, zeroed counters):

- ``router-<policy>``: this router, which learns each replica's models from /v1/models and
  routes within the model's pool (``prefix`` with LoRA affinity, ``cache_aware``,
  ``round_robin`` within the pool);
- ``nginx``: the nginx config rendered without model lists - what a model-blind consistent-hash
  balancer does; the replicas answer vLLM's 404 to a model they do not serve, and its 404 rate is
  reported. It runs three times, each on a fresh fleet: its ring hashes ``host:port`` and the
  ports are ephemeral, so which keys land on a replica that does not serve their model - and so
  its 404 rate - is a draw per fleet.

Hit rate is the fleet's own ``vllm:prefix_cache_hits_total / queries_total`` delta (tokens); TTFT
is the client's first content chunk, over the requests that succeeded.

Cost: per setup one fleet start (~2 s), one setup start and the run (``--requests`` at
``--rate``); about 2 minutes with the defaults. Run it under ``flock /work/.bench.lock``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.compare import FleetParams, _commit
from loadtest.fleet import Fleet, parse_loras, parse_models
from loadtest.runner import Plan, run
from loadtest.setups import launch, parse_setup
from loadtest.stats import summarize
from loadtest.workloads import Request, WorkloadSpec, generate

ROOT = Path(__file__).resolve().parents[1]
MODELS = "llama:2,qwen:2"
LORAS = "llama:sql,llama:support"
# share of the traffic per model name (an adapter is a model name of its own)
MIX = (("llama", 0.4), ("qwen", 0.3), ("sql", 0.15), ("support", 0.15))
# nginx three times: its ring hashes host:port and the fleet's ports are ephemeral, so which
# models' keys land on replicas that do not serve them changes from fleet to fleet
SETUPS = ("router-prefix", "router-cache_aware", "router-round_robin", "nginx", "nginx", "nginx")


def mixed_requests(total: int, rate: float, seed: int) -> list[Request]:
    """One shared-prefix workload per model of `MIX`, merged by arrival time."""
    merged: list[Request] = []
    for k, (model, share) in enumerate(MIX):
        n = max(1, round(total * share))
        spec = WorkloadSpec("shared-prefix", requests=n, rate=rate * share, seed=seed + k,
                            prompts=4, model=model)
        merged += [dataclasses.replace(r, group=f"{model}/{r.group}") for r in generate(spec)]
    merged.sort(key=lambda r: (r.at, r.group))
    return [dataclasses.replace(r, idx=i) for i, r in enumerate(merged)]


def run_one(name: str, requests: Sequence[Request], rate: float, params: FleetParams,
            workdir: Path) -> dict[str, Any]:
    setup = parse_setup(name)
    fleet = Fleet.mixed(parse_models(MODELS), parse_loras(LORAS), max_lora=1,
                        log_dir=str(workdir / name / "fleet"), **params.replica_options())
    fleet.start()
    try:
        replicas = list(zip(fleet.names, fleet.urls, strict=True))
        with launch(setup, replicas, workdir / name) as launched:
            time.sleep(1.0)  # the router's first probes read every /v1/models
            plan = Plan(target=launched.url, rate=rate, max_requests=len(requests),
                        prefix_hash_header=setup.prefix_hash_header,
                        replica_urls=tuple(fleet.urls), progress_label=name)
            result = run(plan, requests, {"name": "mixed-models"})
    finally:
        fleet.stop()
    s = result.summary()
    model_of = {r.idx: r.group.split("/", 1)[0] for r in requests}
    ttft_by_model = {m: summarize([o.ttft for o in result.outcomes
                                   if o.ok and o.ttft is not None and model_of[o.idx] == m])
                     for m, _ in MIX}
    not_found = sum(1 for o in result.outcomes if o.status == 404)
    return {"setup": name, "sent": s["sent"], "ok": s["ok"], "not_found": not_found,
            "errors": s["errors"], "hit_rate": s["hit_rate"], "ttft": s["ttft"],
            "ttft_by_model": ttft_by_model, "load_max_over_mean": s["load_max_over_mean"]}


def _ms(summary: dict[str, Any], key: str) -> str:
    v = summary.get(key)
    return "-" if v is None or v != v else f"{v * 1000:.0f}"


def _pct(v: Any) -> str:
    return "-" if v is None or v != v else f"{v * 100:.1f}%"


def markdown(results: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/benchmarks-models.md (pure)."""
    out = ["# Benchmarks: several models and LoRA adapters behind one router\n",
           "Generated by `python -m loadtest.bench_models`; do not edit by hand - rerun it.\n",
           f"- date: {meta['date']}\n- machine: {meta['machine']}\n- code: commit "
           f"{meta['commit']}\n- wall time: {meta['wall']:.0f} s\n",
           "Everything shares this machine's cores; compare setups within the table (same run, "
           "same requests), not across runs.\n",
           "## Mixed-model workload\n",
           f"Fleet: `prefix-loadtest fleet --models {MODELS} --loras {LORAS} --max-lora 1` "
           f"(llama-0/1 serve llama, sql and support; qwen-0/1 serve qwen), "
           f"{meta['params']['kv_blocks']} KV blocks of {meta['params']['block_size']} tokens "
           "per replica, one LoRA slot per step, 50 ms per adapter load. Traffic: "
           f"{meta['requests']} streamed requests at {meta['rate']:g}/s (open loop), "
           + ", ".join(f"{int(share * 100)} % {m}" for m, share in MIX)
           + "; each model has its own shared-prefix workload (4 system prompts of 1-4k tokens). "
           "Every setup gets a fresh fleet and the same requests.\n",
           "| setup | sent | ok | 404 (model not served) | hit rate | TTFT p50 ms | "
           "TTFT p99 ms | " + " | ".join(f"{m} p50 ms" for m, _ in MIX) + " | max/mean load |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | " + " | ".join(
               "---:" for _ in MIX) + " | ---: |"]
    for r in results:
        if "failed" in r:
            out.append(f"| {r['setup']} | failed: {r['failed']} |")
            continue
        per = " | ".join(_ms(r["ttft_by_model"][m], "p50") for m, _ in MIX)
        out.append(f"| {r['setup']} | {r['sent']} | {r['ok']} | {r['not_found']} "
                   f"({r['not_found'] / max(1, r['sent']) * 100:.0f} %) | {_pct(r['hit_rate'])} "
                   f"| {_ms(r['ttft'], 'p50')} | {_ms(r['ttft'], 'p99')} | {per} | "
                   f"{r['load_max_over_mean']:.2f} |")
    out += ["",
            "`router-*` learn who serves what from /v1/models and route within the model's pool, "
            "so no request reaches a replica that would 404; `round_robin` rotates within the "
            "pool. `nginx` is the config `prefix-router nginx-config` renders without model lists "
            "(one consistent-hash upstream over every replica): a model-blind balancer, whose "
            "404s are the replicas' own answers to a model they do not serve. Its ring hashes "
            "`host:port` and the fleet's ports are ephemeral, so each fresh fleet draws which of "
            "the 16 system prompts (4 per model) land on a replica that does not serve their "
            "model: its 404 rate varies from fleet to fleet (three fleets above). A model-blind "
            "round robin would send every request to a random replica: here half of them serve "
            "any given model. Hit rate and TTFT cover only the requests that were served, so "
            "they are not comparable for `nginx`.\n",
            "## Reproduce\n",
            "```",
            "flock /work/.bench.lock python -m loadtest.bench_models",
            "python -m loadtest.bench_models --requests 80 --setup router-prefix --setup nginx",
            "```", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--rate", type=float, default=12.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setup", action="append", default=None, help=f"default: {SETUPS}")
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks-models.md"))
    p.add_argument("--json", default=str(ROOT / "build" / "bench" / "models.json"))
    args = p.parse_args(argv)
    requests = mixed_requests(args.requests, args.rate, args.seed)
    params = FleetParams()
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        for name in args.setup or SETUPS:
            unavailable = parse_setup(name).unavailable()
            if unavailable:
                results.append({"setup": name, "failed": unavailable})
                continue
            result = run_one(name, requests, args.rate, params, Path(tmp) / str(len(results)))
            runs = sum(1 for r in results if r["setup"].split(" ")[0] == name)
            if (args.setup or SETUPS).count(name) > 1:
                result["setup"] = f"{name} (fleet {runs + 1})"
            results.append(result)
            print(json.dumps({k: results[-1][k] for k in ("setup", "ok", "not_found",
                                                           "hit_rate")}), file=sys.stderr)
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.processor() or platform.machine()}, Python "
                       f"{platform.python_version()}", "commit": _commit(),
            "wall": time.monotonic() - t0, "requests": len(requests), "rate": args.rate,
            "params": dataclasses.asdict(params)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                                          default=str) + "\n")
    Path(args.doc).write_text(markdown(results, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
