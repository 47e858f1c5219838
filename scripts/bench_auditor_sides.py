#!/usr/bin/env python3
"""``prefix-audit`` throughput of two trees side by side in one run, default and ``--tokenizer``.

The issue-25 comparison: the same bench trace (:func:`bench_auditor.lines`) and the same trained
byte-level BPE (:func:`bench_auditor.train_tokenizer`, vocab 4,096) are audited by this tree and
by ``--base`` (a checkout of another commit, e.g. ``git worktree add --detach /tmp/prev REV``),
each audit in a fresh process importing that tree's ``templates_audit`` first; rounds interleave
the trees (A B, then B A, ...) so that the machine's load drifts over both alike. Timed as
``bench_auditor.audit_file`` times it: CPU seconds of the child for read + parse + audit +
report, the tokenizer loaded beforehand.

``--instructions N``: instead of CPU time, counted instructions per request (``valgrind
--tool=cachegrind``): the difference between auditing 2N and N requests, divided by N (start-up
and imports cancel out), with ``PYTHONHASHSEED=0``. Slow (~50x), exact to well under 1 %.

Usage: ``python scripts/bench_auditor_sides.py --base /tmp/prev [--rounds 3] [--requests 20000]
[--hf-requests 5000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_auditor import lines, train_tokenizer  # noqa: E402

# The child: only APIs both trees have (load_tokenizer(path), Auditor(tok, cache_blocks=)).
CHILD = r"""
import json, sys, time
tree, trace, tok, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, tree)
from itertools import islice
from templates_audit.analysis import DEFAULT_CACHE_BLOCKS, Auditor
from templates_audit.tokenize import load_tokenizer
import templates_audit
assert templates_audit.__file__.startswith(tree), templates_audit.__file__
from templates_audit.traces import iter_trace
if tok.endswith(":full"):
    t = load_tokenizer(tok[:-5], incremental=False)
else:
    t = load_tokenizer(None if tok == "default" else tok)
auditor = Auditor(t, cache_blocks=DEFAULT_CACHE_BLOCKS)
start = time.process_time()
auditor.add_all(islice(iter_trace([trace]), limit))
s = auditor.report().summary
print(json.dumps({"requests": s.requests, "cpu_s": time.process_time() - start,
                  "tokens": s.prompt_tokens / max(s.requests, 1)}))
"""


def run(tree: Path, trace: Path, tok: str, limit: int, valgrind: bool = False) -> dict:
    cmd = [sys.executable, "-c", CHILD, str(tree), str(trace), tok, str(limit)]
    env = dict(os.environ)
    if valgrind:
        env["PYTHONHASHSEED"] = "0"
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
               "--cachegrind-out-file=/dev/null", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tree, env=env)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if valgrind:
        m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
        assert m, out.stderr[-2000:]
        res["instructions"] = int(m.group(1).replace(",", ""))
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the other tree (a checkout)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=20000, help="default-tokenizer requests")
    p.add_argument("--hf-requests", type=int, default=5000, help="--tokenizer requests, this tree")
    p.add_argument("--base-hf-requests", type=int,
                   help="--tokenizer requests, the base tree (default: --hf-requests)")
    p.add_argument("--templates", type=int, default=30)
    p.add_argument("--instructions", type=int, default=0, metavar="N",
                   help="count instructions per request under cachegrind (2N vs N requests)")
    p.add_argument("--paths", default="default,tokenizer",
                   help="which paths to measure (comma-separated: default, tokenizer)")
    args = p.parse_args(argv)
    if args.base_hf_requests is None:
        args.base_hf_requests = args.hf_requests
    trees = {"base": args.base.resolve(), "this": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        n_trace = max(args.requests, args.hf_requests, 2 * args.instructions)
        with trace.open("wb") as fh:
            fh.writelines(lines(n_trace, args.templates))
        tok = Path(tmp) / "tokenizer.json"
        train_tokenizer(tok, args.templates)
        cells = [("default", "default", args.requests, args.requests),
                 ("--tokenizer", str(tok), args.base_hf_requests, args.hf_requests)]
        wanted = {f"--{x}" if x == "tokenizer" else x for x in args.paths.split(",")}
        cells = [c for c in cells if c[0] in wanted]
        if args.instructions:
            n = args.instructions
            for name, t, _, _ in cells:
                per = {}
                for side, tree in trees.items():
                    lo, hi = (run(tree, trace, t, k, valgrind=True) for k in (n, 2 * n))
                    per[side] = (hi["instructions"] - lo["instructions"]) / n
                print(f"{name}: instructions per request (cachegrind, {n:,} -> {2 * n:,} "
                      f"requests): base {per['base']:,.0f}, this {per['this']:,.0f} "
                      f"(this/base {per['this'] / per['base']:.3f})", flush=True)
            return 0
        rates: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for name, t, base_n, this_n in cells:
                for side, tree in order:
                    res = run(tree, trace, t, base_n if side == "base" else this_n)
                    rate = res["requests"] / res["cpu_s"]
                    rates.setdefault((name, side), []).append(rate)
                    print(f"round {r + 1} {name:11s} {side}: {res['requests']:,} requests "
                          f"(~{res['tokens']:,.0f} tokens) in {res['cpu_s']:.2f} CPU s = "
                          f"{rate:,.0f} requests/s", flush=True)
        print(f"\nmedian of {args.rounds} interleaved rounds (base = {args.base}):")
        for name, *_ in cells:
            b, t = (statistics.median(rates[(name, s)]) for s in ("base", "this"))
            print(f"{name:11s}: base {b:,.0f} requests/s, this {t:,.0f} requests/s, "
                  f"this/base {t / b:.2f}  (per round: "
                  + ", ".join(f"{x:,.0f}/{y:,.0f}" for x, y in
                              zip(rates[(name, 'base')], rates[(name, 'this')], strict=True))
                  + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
