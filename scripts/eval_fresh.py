"""Score ``prefix-audit`` on the fresh generators of issue 34, one or several code versions at once.

    python scripts/eval_fresh.py --seeds 101,102,103 --gen a --gen b \\
        --side old=/tmp/old-main --side new=/work/main --json /tmp/fresh.json

For every generator and seed the trace is generated once (``scripts/gen_fresh_<g>.py``, into
``--workdir`` or a temporary directory), then audited by every side with
``python -m templates_audit <trace> --format json --no-progress`` plus the ``audit_args`` the
generator recorded (generator A's ``--chat-template``). A side ``label=PATH`` runs with
``PATH`` first on ``PYTHONPATH`` and as the working directory, so ``PATH/templates_audit`` is
the code audited; the origin of the imported package is checked and printed. Without
``--side`` the one side ``current`` is the code of this checkout.

Matching (``evaluate``, pure: truth dict + report dict -> scores):

1. **Template -> family.** A template's ``reference`` is ``file:line``; the line's family is
   ``truth["request_families"][line - 1]``. A template whose reference cannot be read maps to
   no family.
2. **Finding -> fields.** A finding of a template mapped to a family with volatile fields
   matches a field of that family when any of these holds:
   - *value*: an example (split at ``…``, whitespace collapsed, case-folded) equals one of the
     field's injected values, contains one of >= 4 characters (a block field's values are its
     items, so an example holding two items matches), or is a part of one that has >= 4
     characters and more than half the value's length (an example cut short);
   - *context*: the last ``k`` characters of the finding's ``context.before`` equal the last
     ``k`` of the field's ``before`` (``k = min(24, both lengths)``, ``k >= 6``), or likewise
     the first ``k`` of ``context.after`` and the field's ``after``;
   - *role*: both are ``tools``, or both are ``template`` (a family has at most one field of
     each of these roles).
   When no field of the reference family matches, the fields of every other family with fields
   are tried by *value* only, with 6 characters instead of 4 (a template that merged two
   families may report the other family's field). A
   finding of a template mapped to a static family, or to no family, matches nothing.
3. **Scores.** A field is *found (any kind)* when a finding matches it, *found (strict)* when a
   matching finding's kind is the field's ``kind`` or one of its ``also_ok`` kinds. A finding
   that matches no field is *false*; one that matches fields but none with an acceptable kind
   is *wrong kind*. *Duplicates* = sum over fields of (matching findings - 1): the issue asks for
   one finding per field per template and one template per family. *Splits*: families with more
   than one template; *extra templates*: sum of (templates - 1) over families. *Merges*:
   families that no template references (their requests were grouped under another family's
   template, or dropped); *overfull*: templates with more requests than their family has.
   Recall = found / fields, over the fields of all families.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CONTEXT_MAX, CONTEXT_MIN, CONTAIN_MIN, CROSS_MIN = 24, 6, 4, 6


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _pieces(example: str) -> list[str]:
    return [p for p in (_norm(x) for x in example.split("…")) if p]


def value_match(examples: Iterable[str], values: Iterable[str], *, min_len: int = CONTAIN_MIN
                ) -> bool:
    """An example equals a value, contains a value of >= ``min_len`` chars, or is a part of a
    value that is >= ``min_len`` chars and more than half of it (a truncated example; a short
    number inside a long id is no evidence)."""
    vals = [v for v in (_norm(x) for x in values) if v]
    for ex in examples:
        for piece in _pieces(str(ex)):
            for v in vals:
                if piece == v:
                    return True
                if len(v) >= min_len and v in piece:
                    return True
                if len(piece) >= min_len and 2 * len(piece) > len(v) and piece in v:
                    return True
    return False


def _context_eq(a: str | None, b: str | None, *, tail: bool) -> bool:
    if not a or not b:
        return False
    a = a.lstrip("…") if tail else a.rstrip("…")
    k = min(CONTEXT_MAX, len(a), len(b))
    if k < CONTEXT_MIN:
        return False
    return a[-k:] == b[-k:] if tail else a[:k] == b[:k]


def field_matches(finding: Mapping[str, Any], fld: Mapping[str, Any]) -> bool:
    """Does ``finding`` (a report finding) point at ``fld`` (a truth field)? See the module doc."""
    if value_match(finding.get("examples") or [], fld.get("values") or []):
        return True
    ctx = finding.get("context") or {}
    if _context_eq(ctx.get("before"), fld.get("before"), tail=True):
        return True
    if _context_eq(ctx.get("after"), fld.get("after"), tail=False):
        return True
    role = finding.get("role")
    return role in ("tools", "template") and role == fld.get("role")


def reference_line(reference: str | None) -> int | None:
    if not reference or ":" not in reference:
        return None
    tail = reference.rsplit(":", 1)[1]
    return int(tail) if tail.isdigit() else None


def template_families(truth: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, str | None]:
    """Template id -> family of its reference request (None when unknown)."""
    lines = truth["request_families"]
    out: dict[str, str | None] = {}
    for t in report.get("templates", []):
        line = reference_line(t.get("reference"))
        out[t["id"]] = lines[line - 1] if line is not None and 1 <= line <= len(lines) else None
    return out


def _kinds_ok(fld: Mapping[str, Any]) -> set[str]:
    return {fld["kind"], *fld.get("also_ok", [])}


def evaluate(truth: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """Scores of one audit report against the generator's truth (module docstring)."""
    families = {f["name"]: f for f in truth["families"]}
    fields = {(f["name"], x["name"]): x for f in truth["families"] for x in f["fields"]}
    tfam = template_families(truth, report)
    hits: dict[tuple[str, str], list[str]] = defaultdict(list)
    strict: set[tuple[str, str]] = set()
    false, wrong = [], []
    for i, fnd in enumerate(report.get("findings", [])):
        fid = str(fnd.get("id", i))
        fam = tfam.get(fnd.get("template", ""))
        matched: list[tuple[str, str]] = []
        if fam is not None and families[fam]["fields"]:
            matched = [k for k in fields if k[0] == fam and field_matches(fnd, fields[k])]
            if not matched:  # a merged template: another family's field, by value only
                ex = fnd.get("examples") or []
                matched = [k for k in fields if k[0] != fam and value_match(
                    ex, fields[k].get("values") or [], min_len=CROSS_MIN)]
        if not matched:
            false.append({"id": fid, "family": fam, "kind": fnd.get("kind"),
                          "examples": list(fnd.get("examples") or [])[:2]})
            continue
        ok = [k for k in matched if fnd.get("kind") in _kinds_ok(fields[k])]
        for k in matched:
            hits[k].append(fid)
        strict.update(ok)
        if not ok:
            wrong.append({"id": fid, "kind": fnd.get("kind"),
                          "fields": [f"{a}/{b}" for a, b in matched]})
    per_family = Counter(f for f in tfam.values() if f is not None)
    fam_requests: Counter[str] = Counter()
    overfull = []
    for t in report.get("templates", []):
        fam = tfam.get(t["id"])
        if fam is not None:
            fam_requests[fam] += int(t.get("requests", 0))
            if int(t.get("requests", 0)) > families[fam]["count"]:
                overfull.append(t["id"])
    n_fields = len(fields)
    n_fam = len(families)
    templates = int(report.get("summary", {}).get("templates", len(report.get("templates", []))))
    return {
        "families": n_fam,
        "static_families": sum(1 for f in families.values() if not f["fields"]),
        "fields": n_fields,
        "templates": templates,
        "ratio": round(templates / n_fam, 3) if n_fam else 0.0,
        "found_strict": len(strict),
        "found_any": len(hits),
        "recall_strict": round(len(strict) / n_fields, 4) if n_fields else 1.0,
        "recall_any": round(len(hits) / n_fields, 4) if n_fields else 1.0,
        "findings": len(report.get("findings", [])),
        "false": len(false),
        "false_on_static": sum(1 for x in false if x["family"] is not None
                               and not families[x["family"]]["fields"]),
        "wrong_kind": len(wrong),
        "duplicates": sum(len(v) - 1 for v in hits.values()),
        "duplicated_fields": sum(1 for v in hits.values() if len(v) > 1),
        "splits": sum(1 for n in per_family.values() if n > 1),
        "extra_templates": sum(n - 1 for n in per_family.values() if n > 1),
        "merges": sum(1 for f in families if per_family[f] == 0),
        "overfull_templates": len(overfull),
        "missed_strict": sorted(f"{a}/{b}" for a, b in fields if (a, b) not in strict),
        "missed_any": sorted(f"{a}/{b}" for a, b in fields if (a, b) not in hits),
        "false_samples": false[:10],
        "wrong_kind_samples": wrong[:10],
    }


# ---------------------------------------------------------------------------------------------
# running generators and auditors


def parse_side(text: str) -> tuple[str, Path | None]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--side expects LABEL=PATH, got {text!r}")
    p = Path(path).resolve()
    if not (p / "templates_audit" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"--side {label}: {p}/templates_audit is not a package")
    return label, p


def side_env(path: Path | None) -> tuple[dict[str, str], Path]:
    env = dict(os.environ)
    if path is None:
        return env, ROOT
    env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [env.get("PYTHONPATH")])])
    return env, path


def package_origin(python: str, path: Path | None) -> str:
    env, cwd = side_env(path)
    out = subprocess.run([python, "-c", "import templates_audit; print(templates_audit.__file__)"],
                         env=env, cwd=cwd, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def generate(gen: str, seed: int, requests: int, out: Path, python: str) -> dict[str, Any]:
    script = SCRIPTS / f"gen_fresh_{gen}.py"
    if not script.is_file():
        raise SystemExit(f"eval_fresh: no generator {script}")
    subprocess.run([python, str(script), "--seed", str(seed), "--requests", str(requests),
                    "--out", str(out)], check=True, timeout=600)
    return json.loads((out / "truth.json").read_text(encoding="utf-8"))


def audit(trace: Path, args: Sequence[str], path: Path | None, python: str) -> dict[str, Any]:
    env, cwd = side_env(path)
    cmd = [python, "-m", "templates_audit", str(trace), "--format", "json", "--no-progress",
           *args]
    run = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=3600)
    if run.returncode not in (0, 1):
        raise SystemExit(f"eval_fresh: {' '.join(cmd)} exited {run.returncode}:\n{run.stderr}")
    report: dict[str, Any] = json.loads(run.stdout)
    return report


COLUMNS = [("families", "families"), ("templates", "templates"), ("ratio", "ratio"),
           ("fields", "fields"),
           ("recall_strict", "recall strict"), ("recall_any", "recall any"),
           ("false", "false"), ("wrong_kind", "wrong kind"), ("duplicates", "duplicates"),
           ("splits", "splits"), ("merges", "merges")]


def total(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Sums over seeds; recall over all fields of all seeds; ratio as min-max."""
    s: dict[str, Any] = {k: sum(r[k] for r in rows) for k in (
        "families", "fields", "found_strict", "found_any", "false", "wrong_kind", "duplicates",
        "splits", "merges")}
    s["templates"] = f"{min(r['templates'] for r in rows)}-{max(r['templates'] for r in rows)}"
    s["families"] = f"{min(r['families'] for r in rows)}-{max(r['families'] for r in rows)}"
    s["ratio"] = f"{min(r['ratio'] for r in rows):.2f}-{max(r['ratio'] for r in rows):.2f}"
    s["recall_strict"] = round(s["found_strict"] / s["fields"], 4) if s["fields"] else 1.0
    s["recall_any"] = round(s["found_any"] / s["fields"], 4) if s["fields"] else 1.0
    return s


def markdown(results: Sequence[Mapping[str, Any]]) -> str:
    head = "| side | generator | seed | " + " | ".join(h for _, h in COLUMNS) + " |"
    lines = [head, "|" + "---|" * 3 + "---:|" * len(COLUMNS)]
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        groups[(r["side"], r["generator"])].append(r)
    for (side, gen), rows in groups.items():
        for r in rows:
            m = r["scores"]
            cells = [f"{m[k]:.2f}" if k.startswith("recall") or k == "ratio" else str(m[k])
                     for k, _ in COLUMNS]
            lines.append(f"| {side} | {gen} | {r['seed']} | " + " | ".join(cells) + " |")
        if len(rows) > 1:
            t = total([r["scores"] for r in rows])
            cells = [f"{t[k]:.2f}" if k.startswith("recall") else str(t[k]) for k, _ in COLUMNS]
            lines.append(f"| **{side}** | **{gen}** | all | " + " | ".join(cells) + " |")
    notes = []
    for r in results:
        m = r["scores"]
        if m["missed_any"] or m["missed_strict"]:
            strict_only = [x for x in m["missed_strict"] if x not in m["missed_any"]]
            notes.append(f"- {r['side']} {r['generator']} seed {r['seed']}: missed "
                         f"{', '.join(m['missed_any']) or '-'}; found with another kind only: "
                         f"{', '.join(strict_only) or '-'}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="101,102,103", help="comma-separated seeds")
    p.add_argument("--gen", action="append", help="generator letter (a, b, c); default a and b")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--side", action="append", type=parse_side, metavar="LABEL=PATH",
                   help="code to audit with (repeatable); default: this checkout as 'current'")
    p.add_argument("--pythonpath", action="append", type=Path, metavar="P",
                   help="unlabelled --side: P, labelled with its directory name")
    p.add_argument("--workdir", type=Path, help="keep generated traces here (default: temporary)")
    p.add_argument("--json", type=Path, help="write every score and per-field detail here")
    p.add_argument("--python", default=sys.executable, help="interpreter for generators and audits")
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    gens = a.gen or ["a", "b"]
    sides: list[tuple[str, Path | None]] = list(a.side or [])
    sides += [parse_side(f"{x.resolve().name}={x}") for x in a.pythonpath or []]
    if not sides:
        sides = [("current", None)]
    if len({label for label, _ in sides}) != len(sides):
        p.error("side labels must be distinct")
    origins = {label: package_origin(a.python, path) for label, path in sides}
    for label, path in sides:
        if path is not None and not origins[label].startswith(str(path)):
            p.error(f"side {label}: templates_audit imports from {origins[label]}, not {path}")
        print(f"side {label}: {origins[label]}", file=sys.stderr)
    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="eval_fresh_")
    work = a.workdir or Path(tmp.name)  # type: ignore[union-attr]
    results: list[dict[str, Any]] = []
    try:
        for gen in gens:
            for seed in seeds:
                out = work / f"{gen}-{seed}"
                truth = generate(gen, seed, a.requests, out, a.python)
                for label, path in sides:
                    report = audit(out / "traces.jsonl", truth.get("audit_args", []), path,
                                   a.python)
                    results.append({"side": label, "generator": f"gen_fresh_{gen}",
                                    "seed": seed, "scores": evaluate(truth, report)})
                    print(f"{label} {gen} {seed}: done", file=sys.stderr)
    finally:
        if tmp is not None:
            tmp.cleanup()
    # one table per side order: rows grouped by side then generator
    results.sort(key=lambda r: ([s for s, _ in sides].index(r["side"]), r["generator"], r["seed"]))
    print(markdown(results), end="")
    if a.json:
        a.json.write_text(json.dumps({"sides": origins, "requests": a.requests, "seeds": seeds,
                                      "results": results}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
