#!/usr/bin/env python3
"""Score ``prefix-audit`` on traces of :mod:`gen_traces` against the truth recorded with them.

Per trace (one seed), audited in-process with the default tokenizer and ChatML:

* a **slot** is one injected field of one generator template (``Field.slot``) that took two or
  more values in the trace; slots whose truth says ``finding`` are the recall set, ``variant``
  slots are scored apart;
* a slot is **found** when a finding on a report template holding that generator template's
  requests has an accepted kind (:data:`ACCEPT`) and one of its examples overlaps one of the
  slot's values (either contains the other);
* a **false finding** overlaps no slot of any generator template in its report template; one
  that overlaps a slot with a kind not accepted for it is a **wrong-kind** finding (the slot is
  then missed; a variant reported under another kind is one);
* a report template holding requests of two generator templates **merges** them; a generator
  template whose requests land in several report templates is **split**;
* a **static** generator template must get no finding.

Usage: ``python scripts/eval_generated.py --seeds 0 1 2 [--requests 3000] [--json] [--verbose]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gen_traces import Request, generate

from templates_audit.analysis import Auditor
from templates_audit.traces import parse_record

TUNING_SEEDS = tuple(range(10))
HELD_OUT_SEEDS = (1000, 1001, 1002, 1003, 1004)  # not run while tuning (issue 19)

# Truth kind -> report kinds that count as the right kind.
ACCEPT: dict[str, frozenset[str]] = {
    "name": frozenset({"name"}),
    "numeric_id": frozenset({"numeric_id"}),
    "prefixed_id": frozenset({"numeric_id", "hex_id"}),
    "version": frozenset({"version"}),
    "date": frozenset({"date", "timestamp"}),
    "time": frozenset({"time", "timestamp"}),
    "timestamp": frozenset({"timestamp", "date", "time"}),
    "hex_id": frozenset({"hex_id"}),
    "uuid": frozenset({"uuid", "hex_id"}),
    "secret": frozenset({"secret"}),
    "email": frozenset({"email"}),
    "sampled_block": frozenset({"sampled_block", "reordered_block"}),
    "reordered_block": frozenset({"reordered_block"}),
    "variant": frozenset({"variant"}),
}


def _overlaps(example: str, values: set[str]) -> bool:
    ex = example.strip()
    if len(ex) < 2:
        return False
    return any(v in ex or (ex in v and len(ex) >= 3) for v in values)


def evaluate(seed: int, requests: int = 3000) -> dict[str, Any]:
    trace: list[Request] = generate(seed, requests)
    auditor = Auditor()
    tpl_of: list[str] = []  # report template of each request
    for i, req in enumerate(trace, 1):
        rec = parse_record(json.dumps(req.body).encode(), "gen", i)
        auditor.add(rec)
        prompt = auditor._builder.build(rec)
        tid, _ = auditor.index.lookup_exact(rec.model or "", prompt.static_text)
        tpl_of.append(tid or "?")
    report = auditor.report()
    gen_in: dict[str, Counter[str]] = defaultdict(Counter)  # report template -> generator tpls
    rep_of: dict[str, Counter[str]] = defaultdict(Counter)  # generator tpl -> report templates
    values: dict[tuple[str, str], set[str]] = defaultdict(set)
    slot_info: dict[tuple[str, str], tuple[str, str, str]] = {}
    for req, tid in zip(trace, tpl_of, strict=True):
        gen_in[tid][req.template] += 1
        rep_of[req.template][tid] += 1
        for f in req.fields:
            values[(req.template, f.slot)].add(f.value)
            slot_info[(req.template, f.slot)] = (f.kind, f.expect, f.position)
    static = {r.template for r in trace if not r.fields}
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    false: list[dict[str, Any]] = []
    wrong_kind: list[dict[str, Any]] = []
    static_findings: list[dict[str, Any]] = []
    for f in report.findings:
        gens = gen_in.get(f.template, Counter())
        hit = overlap = False
        for g in gens:
            for (gt, slot), vals in values.items():
                if gt != g or not any(_overlaps(ex, vals) for ex in f.examples):
                    continue
                kind, expect, _ = slot_info[(gt, slot)]
                found[(gt, slot)].add(f.kind)
                overlap = True
                if f.kind in ACCEPT[kind] and (expect != "variant" or f.kind == "variant"):
                    hit = True
        row = {"template": f.template, "gen": sorted(gens), "kind": f.kind,
               "example": [e[:60] for e in f.examples[:2]], "lost": f.tokens_lost_per_request}
        if set(gens) & static:
            static_findings.append(row)
        if not overlap:
            false.append(row)
        elif not hit:
            wrong_kind.append(row)
    slots = []
    for key, vals in values.items():
        kind, expect, pos = slot_info[key]
        if len(vals) < 2 or expect == "none":
            continue
        kinds = found.get(key, set())
        slots.append({"template": key[0], "slot": key[1], "kind": kind, "expect": expect,
                      "position": pos, "found": sorted(kinds), "ok": bool(kinds & ACCEPT[kind])})
    merged = [{"template": t, "gen": dict(c)} for t, c in gen_in.items() if len(c) > 1]
    split = [{"gen": g, "templates": len(c), "largest": max(c.values()), "requests": sum(c.values())}
             for g, c in rep_of.items() if len(c) > 1]
    recall_rows = [s for s in slots if s["expect"] == "finding"]
    variant_rows = [s for s in slots if s["expect"] == "variant"]
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in recall_rows:
        per_kind[s["kind"]][0] += s["ok"]
        per_kind[s["kind"]][1] += 1
    return {
        "seed": seed, "requests": len(trace), "generator_templates": len(rep_of),
        "report_templates": report.summary.templates,
        "recall": sum(s["ok"] for s in recall_rows) / max(len(recall_rows), 1),
        "slots": len(recall_rows), "found": sum(s["ok"] for s in recall_rows),
        "per_kind": {k: v for k, v in sorted(per_kind.items())},
        "variants_ok": sum(s["ok"] for s in variant_rows), "variants": len(variant_rows),
        "false_findings": len(false), "wrong_kind_findings": len(wrong_kind),
        "static_templates": len(static),
        "static_with_finding": len({g for r in static_findings for g in r["gen"] if g in static}),
        "merged": merged, "split": split,
        "observed_hit_rate": report.summary.observed_hit_rate,
        "achievable_hit_rate": report.summary.achievable_hit_rate,
        "misses": [s for s in slots if not s["ok"]], "false": false,
    }


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        for k, (ok, n) in r["per_kind"].items():
            per_kind[k][0] += ok
            per_kind[k][1] += n
    slots = sum(r["slots"] for r in results)
    return {
        "seeds": [r["seed"] for r in results],
        "recall": sum(r["found"] for r in results) / max(slots, 1), "slots": slots,
        "recall_by_seed": [round(r["recall"], 3) for r in results],
        "per_kind": {k: {"found": ok, "slots": n, "recall": round(ok / n, 3)}
                     for k, (ok, n) in sorted(per_kind.items())},
        "variants": f"{sum(r['variants_ok'] for r in results)}/{sum(r['variants'] for r in results)}",
        "false_findings_per_trace": sum(r["false_findings"] for r in results) / max(len(results), 1),
        "wrong_kind_findings": sum(r["wrong_kind_findings"] for r in results),
        "static_templates_with_finding": sum(r["static_with_finding"] for r in results),
        "static_templates": sum(r["static_templates"] for r in results),
        "merged_templates": sum(len(r["merged"]) for r in results),
        "split_templates": sum(len(r["split"]) for r in results),
        "report_templates": [r["report_templates"] for r in results],
        "generator_templates": [r["generator_templates"] for r in results],
    }


def print_summary(s: dict[str, Any]) -> None:
    print(f"generated traces, seeds {s['seeds']}: recall {s['recall']:.3f} of {s['slots']} "
          f"injected slots (by seed {s['recall_by_seed']})")
    for k, v in s["per_kind"].items():
        print(f"  {k:<16} {v['found']:>3}/{v['slots']:<3} {v['recall']:.3f}")
    print(f"  variants reported as variants {s['variants']}; false findings per trace "
          f"{s['false_findings_per_trace']:.2f} (wrong kind {s['wrong_kind_findings']}); static templates with a finding "
          f"{s['static_templates_with_finding']}/{s['static_templates']}; merged "
          f"{s['merged_templates']}; split {s['split_templates']}")
    print(f"  templates: generator {s['generator_templates']} report {s['report_templates']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(TUNING_SEEDS))
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    results = [evaluate(s, args.requests) for s in args.seeds]
    summary = summarise(results)
    if args.json:
        print(json.dumps({"summary": summary, "seeds": results}, indent=1))
        return 0
    print_summary(summary)
    if args.verbose:
        for r in results:
            print(f"seed {r['seed']}: recall {r['recall']:.3f}, false {r['false_findings']}")
            for m in r["misses"]:
                print(f"  MISS {m['template']} {m['slot']} [{m['kind']} @{m['position']}] found={m['found']}")
            for f in r["false"]:
                print(f"  FALSE {f['template']} {f['gen']} {f['kind']} {f['example']} lost={f['lost']}")
            for m in r["merged"]:
                print(f"  MERGED {m['template']}: {m['gen']}")
            for m in r["split"]:
                print(f"  SPLIT {m['gen']}: {m['templates']} templates (largest {m['largest']} of {m['requests']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
