"""`python -m loadtest.bench_disagg` (`make bench-disagg`): prefill/decode disaggregation on one
simulated fleet, side by side in one run; writes the "Prefill/decode disaggregation" section of
docs/benchmarks.md.

Fleet: four simulated replicas started once with ``--kv-transfer-config`` (NixlConnector, both
roles), so every setup meets the same instances. Setups (`loadtest.setups`):

* ``router-cache_aware+pd``: this router, the first two replicas ``prefill``, the last two
  ``decode`` (`router.disagg`);
* ``vllm-cache_aware+pd``: vllm-router ``--vllm-pd-disaggregation --prefill URL --prefill URL
  --decode URL --decode URL`` (its default policy, cache_aware, for both pools), when installed;
* ``router-cache_aware``: this router with the same four replicas colocated (every one serves
  both phases).

Workload: ``shared-prefix`` with long prompts - ``--prompts`` system prompts of
``--min-prompt-tokens``..``--max-prompt-tokens`` (Zipf 1.1), a short question each, streamed,
``--max-tokens`` output tokens - the same requests (one seed) for every setup, open loop at
``--rate``. Before each run every replica's prefix cache is reset (`POST /reset_prefix_cache`),
so each setup starts cold; the setups run in turn, ``--rounds`` times interleaved.

Reported per setup (the median over rounds when several): the hit rate of the prefill pool - the
prefix-cache hit tokens over the query tokens of the instances that prefilled (the prefill half
under +pd, all four colocated), from their own ``/metrics`` - and the client's TTFT and
inter-token latency p50 / p99, the replicas' preemptions (``vllm:num_preemptions``: a
preempted request recomputes its prompt, which stalls every stream on that replica), the router
process tree's CPU time per request (from
/proc, `loadtest.setups.cpu_seconds`), errors. The section sits between ``<!-- disagg:begin -->`` and
``<!-- disagg:end -->``; `loadtest.bench` keeps it when it rewrites the rest of the page.

Bounded: every run is ``--requests`` requests with a hard deadline (``--max-time``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest.doc_blocks import replace_block
from loadtest.fleet import Fleet
from loadtest.runner import Plan, run
from loadtest.setups import cpu_seconds, launch, parse_setup, pd_halves
from loadtest.stats import counter_delta
from loadtest.workloads import WorkloadSpec, generate

__all__ = ["BLOCK", "KV_TRANSFER", "SETUPS", "main", "measure", "prefill_hit_rate", "render"]

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "disagg"
KV_TRANSFER = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
SETUPS = ("router-cache_aware+pd", "vllm-cache_aware+pd", "router-cache_aware")


def prefill_hit_rate(per_replica: Mapping[str, Mapping[str, float]],
                     names: Sequence[str]) -> float:
    """Hit tokens over query tokens summed over ``names`` (the instances that prefilled)."""
    hits = sum(per_replica.get(n, {}).get("hit_tokens", 0.0) for n in names)
    queries = sum(per_replica.get(n, {}).get("query_tokens", 0.0) for n in names)
    return hits / queries if queries else float("nan")


def _reset(urls: Sequence[str]) -> None:
    for url in urls:
        req = urllib.request.Request(url + "/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            if not json.loads(resp.read()).get("success"):
                raise RuntimeError(f"{url}: prefix cache not reset (a request still holds blocks)")


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run every available setup ``args.rounds`` times on one fleet; the raw summaries."""
    spec = WorkloadSpec("shared-prefix", requests=args.requests, rate=args.rate, seed=args.seed,
                        prompts=args.prompts, min_prompt_tokens=args.min_prompt_tokens,
                        max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens)
    requests = generate(spec)
    setups = [parse_setup(s) for s in args.setups]
    runs: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    with Fleet(replicas=4, speed=args.speed, kv_blocks=args.kv_blocks,
               kv_transfer_config=KV_TRANSFER, log_dir=str(workdir / "fleet")) as fleet:
        replicas = list(zip(fleet.names, fleet.urls, strict=True))
        for setup in setups:
            reason = setup.unavailable()
            if reason:
                skipped[setup.name] = reason
        for r in range(args.rounds):
            for setup in setups:
                if setup.name in skipped:
                    continue
                _reset(fleet.urls)
                with launch(setup, replicas, workdir / setup.name) as launched:
                    plan = Plan(target=launched.url, rate=args.rate, max_requests=args.requests,
                                max_time=args.max_time, replica_urls=tuple(fleet.urls),
                                progress_label=f"{setup.name} round {r + 1}")
                    pid = launched.pid
                    cpu0 = cpu_seconds(pid) if pid is not None else float("nan")
                    result = run(plan, requests)
                    cpu = cpu_seconds(pid) - cpu0 if pid is not None else float("nan")
                summary = result.summary()
                summary["preemptions"] = {
                    n: counter_delta(result.before.get(n, {}), snap, "vllm:num_preemptions_total")
                    for n, snap in result.after.items()}
                summary["router_cpu_ms_per_request"] = cpu * 1000 / max(1, summary["sent"])
                prefilled = [n for n, _ in (pd_halves(replicas)[0] if setup.pd else replicas)]
                summary["prefill_pool"] = prefilled
                summary["prefill_hit_rate"] = prefill_hit_rate(summary["per_replica"],
                                                               prefilled)
                runs.setdefault(setup.name, []).append(summary)
    return {"workload": {"name": spec.name, "requests": spec.requests, "rate": spec.rate,
                         "prompts": spec.prompts, "min_prompt_tokens": spec.min_prompt_tokens,
                         "max_prompt_tokens": spec.max_prompt_tokens,
                         "max_tokens": spec.max_tokens, "seed": spec.seed},
            "fleet": {"replicas": 4, "speed": args.speed, "kv_blocks": args.kv_blocks,
                      "kv_transfer_config": KV_TRANSFER},
            "rounds": args.rounds, "runs": runs, "skipped": skipped,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def _median(rows: Sequence[Mapping[str, Any]], *path: str) -> float:
    values = []
    for row in rows:
        v: Any = row
        for p in path:
            v = v[p]
        values.append(float(v))
    return statistics.median(values)


def _ms(x: float) -> str:
    return "n/a" if x != x else f"{x * 1000:.0f} ms"


def render(data: Mapping[str, Any]) -> str:
    """The docs/benchmarks.md block for ``data`` (what `measure` returned). Pure."""
    w, f = data["workload"], data["fleet"]
    lines = [f"<!-- {BLOCK}:begin -->", "## Prefill/decode disaggregation", "",
             f"Four simulated replicas (`--kv-transfer-config '{f['kv_transfer_config']}'`, "
             f"`--speed {f['speed']:g}`, `--kv-blocks {f['kv_blocks']}`), one fleet for every "
             "setup; `+pd`: the first two prefill, the last two decode. Workload "
             f"`{w['name']}`: {w['prompts']} system prompts of {w['min_prompt_tokens']}-"
             f"{w['max_prompt_tokens']} tokens, {w['requests']} streamed requests at "
             f"{w['rate']:g} req/s (open loop, seed {w['seed']}), {w['max_tokens']} output "
             "tokens each; prefix caches reset before every run; "
             f"{data['rounds']} round(s), setups interleaved (median over rounds). Prefill-pool "
             "hit rate: prefix-cache hit tokens / query tokens of the instances that prefilled "
             "(the prefill half, or all four colocated), from their `/metrics`. Measured "
             f"{data['date']} by `python -m loadtest.bench_disagg` on the shared 2-core machine.",
             "", "| setup | prefill-pool hit rate | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 "
             "| preemptions | router CPU / request | ok / sent |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in data["runs"].items():
        ok = sum(r["ok"] for r in rows)
        sent = sum(r["sent"] for r in rows)
        lines.append(
            f"| `{name}` | {_median(rows, 'prefill_hit_rate'):.3f} "
            f"| {_ms(_median(rows, 'ttft', 'p50'))} | {_ms(_median(rows, 'ttft', 'p99'))} "
            f"| {_ms(_median(rows, 'itl', 'p50'))} | {_ms(_median(rows, 'itl', 'p99'))} "
            f"| {statistics.median(sum(r['preemptions'].values()) for r in rows):g} "
            f"| {_median(rows, 'router_cpu_ms_per_request'):.2f} ms | {ok} / {sent} |")
    for name, reason in data.get("skipped", {}).items():
        lines.append(f"| `{name}` | not run: {reason} | | | | | | | |")
    lines += _targets(data["runs"])
    lines += ["", f"<!-- {BLOCK}:end -->", ""]
    return "\n".join(lines)


# issue 36's targets: (label, value path, unit, True if higher is better)
_TARGETS = (("prefill-pool hit rate", ("prefill_hit_rate",), "", True),
            ("TTFT p99", ("ttft", "p99"), "ms", False),
            ("inter-token latency p99", ("itl", "p99"), "ms", False))
OURS, THEIRS = SETUPS[0], SETUPS[1]


def _targets(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Issue 36's targets, ours against vllm-router's, with every round's value (so a
    difference smaller than the rounds' spread shows as such)."""
    if OURS not in runs or THEIRS not in runs:
        return []

    def show(v: float, unit: str) -> str:
        return f"{v * 1000:.1f} ms" if unit == "ms" else f"{v:.3f}"

    out = ["", f"Targets: `{OURS}` against `{THEIRS}` (median, then each round):", "",
           "| target | ours | vllm-router | met |", "|---|---|---|---|"]
    for label, path, unit, higher in _TARGETS:
        a, b = _median(runs[OURS], *path), _median(runs[THEIRS], *path)
        met = a >= b if higher else a <= b
        each_a = " / ".join(show(_median([r], *path), unit) for r in runs[OURS])
        each_b = " / ".join(show(_median([r], *path), unit) for r in runs[THEIRS])
        out.append(f"| {label} {'>=' if higher else '<='} | {show(a, unit)} ({each_a}) "
                   f"| {show(b, unit)} ({each_b}) | {'yes' if met else 'no'} |")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--setups", nargs="+", default=list(SETUPS))
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--min-prompt-tokens", type=int, default=2000)
    p.add_argument("--max-prompt-tokens", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-time", type=float, default=180.0)
    p.add_argument("--json", type=Path, default=None, help="also save the raw data here")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--no-doc", action="store_true", help="print the section, write nothing")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_disagg",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-disagg-") as tmp:
        data = measure(args, Path(tmp))
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=1, default=str))
    block = render(data)
    print(block)
    if not args.no_doc:
        doc = args.doc
        doc.write_text(replace_block(doc.read_text() if doc.exists() else "", BLOCK, block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
