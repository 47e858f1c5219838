"""Held-out routing check (issue 18): a workload none of the routing weights were tuned on.

24 long system prompts (1.5-4k tokens); popularity Zipf over them with one prompt carrying
half of all conversations; 35% of requests are follow-up turns of an earlier conversation (the
whole history resent, as chat clients do); 600 requests, closed loop. Two fleets of simulated
vLLM replicas: 4 replicas at concurrency 16 and 8 replicas at concurrency 32. Every setup gets
the same requests on a cold fleet, one after the other in one run (`loadtest.compare`).

    flock /work/.bench.lock .venv/bin/python scripts/heldout_check.py [--out results.json]
    .venv/bin/python scripts/heldout_check.py --sim      # the discrete-event simulator instead

Prints one markdown table per fleet: hit rate, TTFT p50/p99, max/mean requests and prompt
tokens per replica.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.compare import FleetParams, compare  # noqa: E402
from loadtest.runner import Plan  # noqa: E402
from loadtest.setups import parse_setup  # noqa: E402
from loadtest.workloads import CHAT, Request, synthetic_text  # noqa: E402

SETUPS = ("router-cache_aware", "router-prefix", "router-round_robin", "sglang-cache_aware")
FLEETS = ((4, 16), (8, 32))
PROMPTS = 24
REQUESTS = 600
FOLLOW_UP = 0.35
HOT_SHARE = 0.5
MAX_TOKENS = 32
SEED = 18018


def heldout_requests(seed: int = SEED, n: int = REQUESTS) -> list[Request]:
    rng = random.Random(seed)
    prompts = [f"You are assistant #{i} of the held-out suite. " + synthetic_text(
        rng, rng.randint(1100, 3000)) for i in range(PROMPTS)]
    rest = [1.0 / (k ** 1.1) for k in range(1, PROMPTS)]
    scale = (1 - HOT_SHARE) / sum(rest)
    weights = [HOT_SHARE] + [w * scale for w in rest]
    conversations: list[tuple[int, list[dict[str, Any]], int]] = []  # prompt, messages, last i
    out = []
    for i in range(n):
        ready = [c for c, (_, _, last) in enumerate(conversations) if i - last >= 24]
        if ready and rng.random() < FOLLOW_UP:
            c = rng.choice(ready)
            p, msgs, _ = conversations[c]
            msgs.append({"role": "assistant", "content": synthetic_text(rng, MAX_TOKENS)})
        else:
            p = rng.choices(range(PROMPTS), weights)[0]
            msgs = [{"role": "system", "content": prompts[p]}]
            conversations.append((p, msgs, i))
            c = len(conversations) - 1
        msgs.append({"role": "user", "content": synthetic_text(rng, rng.randint(12, 60))})
        conversations[c] = (p, msgs, i)
        body = {"model": "sim-model", "messages": [dict(m) for m in msgs],
                "max_tokens": MAX_TOKENS, "stream": True,
                "stream_options": {"include_usage": True}}
        out.append(Request(i, 0.0, CHAT, body, group=f"p{p}", conversation=f"h{c}"))
    return out


def _row(name: str, s: dict[str, Any]) -> str:
    t = s["ttft"]
    tokens = [r.get("prompt_tokens") or 0 for r in s.get("per_replica", {}).values()]
    spread = f"{max(tokens) / (sum(tokens) / len(tokens)):.2f}" if sum(tokens) else "-"
    return (f"| {name} | {s['hit_rate']:.3f} | {t['p50'] * 1000:.0f} ms | {t['p99'] * 1000:.0f} ms"
            f" | {s['load_max_over_mean']:.2f} | {spread} |")


def run_real(setups: list[str], workdir: Path) -> dict[str, Any]:
    reqs = heldout_requests()
    results = {}
    for replicas, conc in FLEETS:
        plan = Plan("http://unused", concurrency=conc, max_requests=len(reqs), max_time=300.0)
        res = compare({"heldout": (reqs, {"name": "heldout", "requests": len(reqs)})},
                      [parse_setup(s) for s in setups], plan, FleetParams(replicas=replicas),
                      workdir / f"r{replicas}")
        results[f"{replicas} replicas, c={conc}"] = res["workloads"]["heldout"]["setups"]
    return results


def run_sim(setups: list[str]) -> dict[str, Any]:
    from loadtest.simulate import SimConfig, SimRequest, simulate
    from templates_audit.render import ChatRenderer
    from templates_audit.tokenize import default_tokenizer

    tok, renderer = default_tokenizer(), ChatRenderer()
    reqs = heldout_requests()
    results: dict[str, Any] = {}
    fp = FleetParams()
    for replicas, _conc in FLEETS:
        rate = 3.0 * replicas  # about what the closed loop sustains
        sim = [SimRequest(at=i / rate, path=r.path, key_body=r.body,
                          prompt_ids=tok.encode(renderer.render(r.body["messages"])),
                          max_tokens=MAX_TOKENS) for i, r in enumerate(reqs)]
        block = {}
        for name in setups:
            if not name.startswith("router-"):
                continue
            res = simulate(sim, SimConfig(replicas=replicas, policy=name.split("-", 1)[1],
                                          kv_blocks=fp.kv_blocks, max_num_seqs=fp.max_num_seqs))
            block[name] = {"hit_rate": res.hit_rate, "ttft": res.ttft,
                           "load_max_over_mean": res.load_max_over_mean}
        results[f"{replicas} replicas (sim, open loop {rate:g}/s)"] = block
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setup", action="append", help=f"default: {', '.join(SETUPS)}")
    p.add_argument("--sim", action="store_true", help="the discrete-event simulator")
    p.add_argument("--out", help="JSON results")
    args = p.parse_args()
    setups = args.setup or list(SETUPS)
    if args.sim:
        results = run_sim(setups)
    else:
        with tempfile.TemporaryDirectory(prefix="heldout-") as tmp:
            results = run_real(setups, Path(tmp))
    for fleet, block in results.items():
        print(f"\n{fleet}\n\n| setup | hit rate | TTFT p50 | TTFT p99 | max/mean requests |"
              " max/mean prompt tokens |\n|---|---:|---:|---:|---:|---:|")
        for name, s in block.items():
            print(_row(name, s))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
