"""`python -m loadtest.heldout`: the held-out check, a workload nobody tunes on.

Issue #18's independent run, made repeatable: a multi-turn chat workload unlike the `make bench`
ones, generated from a seed chosen at check time, run closed-loop through a few setups at two
fleet sizes on the same simulated fleet, in one run. It is deliberately **not** part of
`make bench` (nor of `loadtest.workloads.WORKLOADS`), so no routing parameter is tuned on it:
pick a new seed when you run it.

Workload (`requests`): 24 long system prompts (``min_prompt_tokens``-``max_prompt_tokens``,
2-4k by default); the first carries half of the conversations, the other 23 share the other half
with Zipf (s = 1) popularity. Each request is, with probability 0.35, a follow-up turn of an
earlier conversation (uniformly among those whose last turn is at least `FOLLOW_GAP` requests
back, so a closed loop of up to that many workers has finished it), resending its whole history
and a new question; otherwise it opens a new conversation with one of the prompts. No ``user``
field. Same seed, same requests.

Setups (`default_setups`): the router's default policy and cache_aware, prefix, round-robin and
sglang-router cache_aware. Runs (`RUNS`): 4 replicas at concurrency 16 and 8 replicas at
concurrency 32, closed loop,
600 requests each, the compare harness's fleet (`loadtest.compare.FleetParams` defaults: a KV
cache that cannot hold all the prompts on one replica), a fresh fleet per setup. Reports hit rate,
TTFT p50/p99, max/mean prompt tokens and requests per replica, and the one-cache ceiling.

Cost: per fleet size and setup one fleet start, one setup start and 600 requests; a few minutes
in all on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.workloads import CHAT, Request, synthetic_text

__all__ = ["FOLLOW_GAP", "RUNS", "main", "requests"]

FOLLOW_GAP = 32  # a follow-up continues a conversation whose last turn is this many requests back
RUNS = ((4, 16), (8, 32))  # (replicas, closed-loop concurrency)
_QUESTIONS = (
    "Where is my order", "Can I change the delivery address", "Why did the build fail",
    "Explain this error message", "Which plan fits a team of five", "Summarise the ticket",
    "How do I rotate the API key", "Is there a discount for students", "What changed last week",
    "Draft a reply to the customer", "How long does a refund take", "Compare the two options",
)


def requests(n: int = 600, seed: int = 0, prompts: int = 24, min_prompt_tokens: int = 2000,
             max_prompt_tokens: int = 4000, follow_up: float = 0.35, max_tokens: int = 16,
             model: str = "sim-model") -> list[Request]:
    """The held-out requests (closed-loop order; ``at`` is the index)."""
    rng = random.Random(f"heldout-{seed}")
    systems = []
    for p in range(prompts):
        words = int(rng.randint(min_prompt_tokens, max_prompt_tokens) / 1.35)
        systems.append(f"You are the assistant of team {p}. Follow the handbook below.\n"
                       + synthetic_text(rng, words))
    rest = [1.0 / k for k in range(1, prompts)]
    weights = [sum(rest)] + rest  # the first prompt: half of all conversations
    history: list[list[dict[str, Any]]] = []
    last: list[int] = []
    group: list[int] = []
    out = []
    for i in range(n):
        ready = [c for c, at in enumerate(last) if i - at >= FOLLOW_GAP]
        if ready and rng.random() < follow_up:
            c = rng.choice(ready)
        else:
            c = len(history)
            group.append(rng.choices(range(prompts), weights)[0])
            history.append([{"role": "system", "content": systems[group[c]]}])
            last.append(i)
        msgs = history[c]
        msgs.append({"role": "user", "content": f"{rng.choice(_QUESTIONS)}? "
                                                f"(case {rng.randint(10000, 99999)})"})
        body = {"model": model, "messages": [dict(m) for m in msgs], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        turn = sum(1 for m in msgs if m["role"] == "user") - 1
        out.append(Request(i, float(i), CHAT, body, group=f"p{group[c]}",
                           conversation=f"heldout-{c}", turn=turn))
        msgs.append({"role": "assistant", "content": synthetic_text(rng, rng.randint(20, 60))})
        last[c] = i
    return out


@dataclass(frozen=True)
class Row:
    replicas: int
    concurrency: int
    setup: str
    summary: dict[str, Any]


def _balance(summary: dict[str, Any], key: str) -> float | None:
    vals = [float(r.get(key) or 0.0) for r in (summary.get("per_replica") or {}).values()]
    mean = sum(vals) / len(vals) if vals else 0.0
    return max(vals) / mean if mean else None


def markdown(results: dict[str, Any]) -> str:
    from loadtest.report import fmt, ms, pct, table

    lines = []
    for run in results["runs"]:
        first = True
        for name, s in run["setups"].items():
            lines.append([f"{run['replicas']} replicas, c={run['concurrency']}" if first else "",
                          name, pct(s.get("hit_rate")), ms(s["ttft"].get("p50")),
                          ms(s["ttft"].get("p99")), fmt(_balance(s, "prompt_tokens")),
                          fmt(s.get("load_max_over_mean")), str(s.get("error_count", 0))])
            first = False
        lines.append(["", "*one-cache ceiling*", pct(run["ceiling"]["hit_rate"]), "", "", "", "",
                      ""])
    m = results.get("machine") or {}
    head = ("# Held-out check\n\n"
            "Generated by `python -m loadtest.heldout --seed N --out build/bench/heldout.json "
            "--markdown docs/benchmarks-heldout.md` (re-render: `--from-json`). The workload is "
            "deliberately outside `make bench` and the tuned workloads: 24 long system prompts, "
            "one carrying half the conversations, 35% follow-up turns, 600 requests, closed loop, "
            "the compare harness's simulated fleet (768 KV blocks of 16 tokens per replica), a "
            "cold fleet per setup "
            "([simulator.md](simulator.md#the-held-out-check-loadtestheldoutpy)). Pick a new "
            "seed for every check.\n\n"
            f"Seed {results['seed']}, {results['requests']} requests "
            f"(`python -m loadtest.heldout --seed {results['seed']}`)"
            + (f"; commit {m['commit']}, {m.get('date', '')}, {m.get('nproc')} CPUs"
               if m.get("commit") else "") + ".\n\n")
    return head + table(["fleet", "setup", "hit rate", "TTFT p50 ms", "TTFT p99 ms",
                         "max/mean prompt tokens", "max/mean requests", "errors"], lines,
                        ["l", "l", "r", "r", "r", "r", "r", "r"])


def default_setups() -> list[str]:
    """The router's default policy and cache_aware (issue #18's candidate), prefix,
    round-robin and sglang-router cache_aware."""
    from router.settings import POLICIES, RoutingSettings

    mine = [f"router-{RoutingSettings.policy}"]
    if "cache_aware" in POLICIES:
        mine.append("router-cache_aware")
    return list(dict.fromkeys([*mine, "router-prefix", "router-round_robin",
                               "sglang-cache_aware"]))


def run(seed: int, setups: Sequence[str], n: int, workdir: Path,
        runs: Sequence[tuple[int, int]] = RUNS) -> dict[str, Any]:
    from loadtest.compare import FleetParams, compare
    from loadtest.runner import Plan
    from loadtest.setups import parse_setup

    reqs = requests(n, seed)
    out: dict[str, Any] = {"seed": seed, "requests": len(reqs), "runs": []}
    for replicas, conc in runs:
        plan = Plan("http://unused", concurrency=conc, max_requests=len(reqs), max_time=300.0)
        key = f"heldout, {replicas} replicas"
        res = compare({key: (reqs, {"name": "heldout", "seed": seed, "requests": len(reqs)})},
                      [parse_setup(s) for s in setups], plan, FleetParams(replicas=replicas),
                      workdir / f"r{replicas}")
        block = res["workloads"][key]
        out["runs"].append({"replicas": replicas, "concurrency": conc,
                            "setups": block["setups"], "ceiling": block["ceiling"],
                            "failed": block["failed"], "skipped": block["skipped"]})
        out.setdefault("machine", res["machine"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.heldout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, required=True, help="choose a new one for every check")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--setup", action="append", default=None,
                   help="repeatable; default: the router's default policy, cache_aware, "
                        "router-prefix, router-round_robin, sglang-cache_aware")
    p.add_argument("--replicas", action="append", type=int, default=None,
                   help="fleet sizes of RUNS to run (repeatable; default: every one)")
    p.add_argument("--out", help="JSON results")
    p.add_argument("--markdown", help="markdown table (default: stdout)")
    p.add_argument("--from-json", metavar="JSON", help="only render a saved --out file")
    args = p.parse_args(argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="heldout-") as tmp:
            runs = [r for r in RUNS if not args.replicas or r[0] in args.replicas]
            if not runs:
                p.error(f"--replicas: expected one of {', '.join(str(r[0]) for r in RUNS)}")
            results = run(args.seed, args.setup or default_setups(), args.requests, Path(tmp),
                          runs)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    md = markdown(results)
    if args.markdown:
        Path(args.markdown).write_text(md)
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
