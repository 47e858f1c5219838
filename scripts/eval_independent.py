#!/usr/bin/env python3
"""Score ``prefix-audit`` on the traces of ``gen_traces_independent.py`` (issue 19).

The auditor runs as a user runs it — ``python -m templates_audit TRACE --format json`` in a
subprocess (``--pythonpath`` audits with another tree, for before/after in one run) — and its
JSON report is compared with the truth written next to the trace:

* report templates are mapped to generator templates by their ``reference`` line; a generator
  template whose requests are held by two or more report templates is **split**; one whose report
  templates hold more requests than it has **absorbed** another's (a **merge**);
* an injected slot is **found** when a finding on one of its template's report templates has an
  accepted kind (``ACCEPT``) and an example overlapping one of the values injected there (one
  contains the other, or they share 8 characters); *any-kind* recall drops the kind condition;
* a finding is **false** when its examples overlap no value injected in its template (a finding
  on a static template is always false); one that overlaps a value but has a kind accepted for
  none of the slots it overlaps is **wrong-kind**.

Usage::

    python scripts/eval_independent.py                       # tuning seeds, this tree
    python scripts/eval_independent.py --seeds 7001 7002 ... # held-out seeds (run once, at the end)
    python scripts/eval_independent.py --pythonpath /path/to/other/tree --misses
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from gen_traces_independent import HELD_OUT_SEEDS, TUNING_SEEDS, write

ACCEPT: dict[str, frozenset[str]] = {
    "name": frozenset({"name"}),
    "id": frozenset({"numeric_id", "hex_id", "uuid"}),
    "version": frozenset({"version"}),
    "date": frozenset({"date", "timestamp"}),
    "time": frozenset({"time", "timestamp"}),
    "timestamp": frozenset({"timestamp", "date", "time"}),
    "hex": frozenset({"hex_id", "uuid"}),
    "secret": frozenset({"secret"}),
    "sampled": frozenset({"sampled_block", "reordered_block"}),
    "shuffled": frozenset({"reordered_block", "sampled_block"}),
    "variant": frozenset({"variant"}),
}
MIN_SHARED = 8


def overlaps(example: str, value: str) -> bool:
    """An example and an injected value overlap: one holds the other, or 8 characters in common."""
    for piece in example.split("…"):
        piece = piece.strip()
        if len(piece) < 2:
            continue
        if value in piece or piece in value:
            return True
        if min(len(piece), len(value)) >= MIN_SHARED and _shares(piece, value, MIN_SHARED):
            return True
    return False


def _shares(a: str, b: str, n: int) -> bool:
    grams = {a[i:i + n] for i in range(len(a) - n + 1)}
    return any(b[i:i + n] in grams for i in range(len(b) - n + 1))


def audit(trace: Path, pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    # `-m` puts the working directory first on sys.path: run from the other tree, too.
    out = subprocess.run([sys.executable, "-m", "templates_audit", str(trace), "--format", "json",
                          "--no-progress"], capture_output=True, text=True, env=env, check=False,
                         cwd=pythonpath)
    if out.returncode not in (0, 1):
        raise SystemExit(f"prefix-audit failed on {trace}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def score(report: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    owner: dict[int, int] = {}
    for gi, g in enumerate(truth["templates"]):
        for line in g["lines"]:
            owner[line] = gi
    by_g: dict[int, list[dict[str, Any]]] = defaultdict(list)
    tpl_g: dict[str, int] = {}
    for t in report["templates"]:
        gi = owner[int(t["reference"].rsplit(":", 1)[1])]
        by_g[gi].append(t)
        tpl_g[t["id"]] = gi
    findings: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in report["findings"]:
        findings[tpl_g[f["template"]]].append(f)

    slots: list[dict[str, Any]] = []
    false: list[dict[str, Any]] = []
    wrong_kind: list[dict[str, Any]] = []
    split = absorbed = merges = static_with = 0
    zero_cost = 0
    for gi, g in enumerate(truth["templates"]):
        held = sum(t["requests"] for t in by_g[gi])
        split += len(by_g[gi]) > 1
        merges += held > len(g["lines"])
        absorbed += held < len(g["lines"])
        fs = findings[gi]
        static_with += bool(g["static"] and fs)
        for s in g["slots"]:
            hits = [f for f in fs if any(overlaps(e, v) for e in f["examples"] for v in s["values"])]
            right = [f for f in hits if f["kind"] in ACCEPT[s["kind"]]]
            zero_cost += bool(right) and all(f["tokens_lost_per_request"] <= 0 for f in right)
            slots.append({"template": g["name"], "field": s["field"], "kind": s["kind"], "format": s["format"],
                          "scope": s["scope"], "found": bool(right), "any_kind": bool(hits),
                          "got": sorted({f["kind"] for f in hits}), "values": len(s["values"]),
                          "requests": len(g["lines"]), "report_templates": len(by_g[gi])})
        for f in fs:
            over = [s for s in g["slots"] if any(overlaps(e, v) for e in f["examples"] for v in s["values"])]
            entry = {"template": g["name"], "kind": f["kind"], "examples": [e[:80] for e in f["examples"][:2]],
                     "requests": f["requests_affected"]}
            if not over:
                false.append(entry)
            elif not any(f["kind"] in ACCEPT[s["kind"]] for s in over):
                wrong_kind.append(entry)
    return {"seed": truth["seed"], "slots": slots, "false": false, "wrong_kind": wrong_kind,
            "split": split, "absorbed": absorbed, "merges": merges, "zero_cost_found": zero_cost,
            "static_templates": sum(g["static"] for g in truth["templates"]),
            "static_with_finding": static_with, "generator_templates": len(truth["templates"]),
            "report_templates": len(report["templates"]),
            "observed": report["summary"]["observed_hit_rate"],
            "achievable": report["summary"]["achievable_hit_rate"]}


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    slots = [s for r in results for s in r["slots"]]
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    per_format: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in slots:
        k = per_kind[s["kind"]]
        k[0] += s["found"]
        k[1] += s["any_kind"]
        k[2] += 1
        if s["format"]:
            pf = per_format[f"{s['kind']}:{s['format']}"]
            pf[0] += s["found"]
            pf[1] += 1
    n = len(results)
    return {
        "seeds": [r["seed"] for r in results],
        "slots": len(slots),
        "recall": round(sum(s["found"] for s in slots) / max(1, len(slots)), 3),
        "recall_any_kind": round(sum(s["any_kind"] for s in slots) / max(1, len(slots)), 3),
        "per_kind": {k: {"recall": round(v[0] / v[2], 3), "any_kind": round(v[1] / v[2], 3), "slots": v[2]}
                     for k, v in sorted(per_kind.items())},
        "per_format": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_format.items()) if v[0] < v[1]},
        "false_per_trace": round(sum(len(r["false"]) for r in results) / max(1, n), 2),
        "wrong_kind": sum(len(r["wrong_kind"]) for r in results),
        "static_with_finding": f"{sum(r['static_with_finding'] for r in results)}/{sum(r['static_templates'] for r in results)}",
        "merges": sum(r["merges"] for r in results),
        "absorbed": sum(r["absorbed"] for r in results),
        "split": sum(r["split"] for r in results),
        "found_with_zero_cost": sum(r["zero_cost_found"] for r in results),
        "templates": f"{sum(r['report_templates'] for r in results)} reported for {sum(r['generator_templates'] for r in results)} generated",
    }


def evaluate(seeds: list[int], pythonpath: str | None = None, requests: int = 3000,
             out: Path | None = None) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        where = out or Path(tmp)
        for seed in seeds:
            trace, tfile = write(seed, where, requests)
            results.append(score(audit(trace, pythonpath), json.loads(tfile.read_text(encoding="utf-8"))))
    return results


def print_summary(summary: dict[str, Any], label: str = "") -> None:
    print(f"independent traces {label}seeds {summary['seeds']}: {summary['slots']} injected slots")
    print(f"  recall (right kind)  {summary['recall']:.3f}   any kind {summary['recall_any_kind']:.3f}")
    for k, v in summary["per_kind"].items():
        print(f"    {k:<10} {v['recall']:.3f}  (any kind {v['any_kind']:.3f}, {v['slots']} slots)")
    if summary["per_format"]:
        print(f"  formats missed: {summary['per_format']}")
    print(f"  false findings per trace {summary['false_per_trace']}; wrong-kind findings {summary['wrong_kind']}")
    print(f"  static templates with a finding {summary['static_with_finding']}; merges {summary['merges']}, "
          f"absorbed {summary['absorbed']}, split {summary['split']}; {summary['templates']}")
    print(f"  found slots whose findings cost 0 tokens: {summary['found_with_zero_cost']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(TUNING_SEEDS),
                   help=f"default: the tuning seeds; held out: {' '.join(map(str, HELD_OUT_SEEDS))}")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--pythonpath", help="audit with the templates_audit of this tree")
    p.add_argument("--misses", action="store_true", help="list missed slots and false findings")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", type=Path, help="write the traces here instead of a temporary directory")
    a = p.parse_args()
    results = evaluate(a.seeds, a.pythonpath, a.requests, a.keep)
    summary = summarise(results)
    if a.json:
        print(json.dumps({"summary": summary, "results": results} if a.misses else summary, indent=1,
                         ensure_ascii=False))
        return
    print_summary(summary)
    if a.misses:
        for r in results:
            for s in r["slots"]:
                if not s["found"]:
                    print(f"  miss seed {r['seed']}: {s['template']}.{s['field']} ({s['kind']}/{s['format']} "
                          f"{s['scope']}, {s['values']} values, {s['requests']} requests in "
                          f"{s['report_templates']} report templates) got {s['got']}")
            for f in r["false"]:
                print(f"  false seed {r['seed']}: {f['template']} {f['kind']} x{f['requests']} {f['examples']}")
            for f in r["wrong_kind"]:
                print(f"  wrong-kind seed {r['seed']}: {f['template']} {f['kind']} {f['examples']}")
            if r["split"] or r["merges"] or r["absorbed"]:
                print(f"  seed {r['seed']}: split {r['split']} merges {r['merges']} absorbed {r['absorbed']}")
    counts = Counter(s["kind"] for r in results for s in r["slots"])
    print(f"  slots by kind: {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
