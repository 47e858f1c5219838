#!/usr/bin/env python3
"""Evaluate the prompt-template auditor on real system prompts and real chat templates.

Reads ``../shared/data`` at run time (nothing from it is copied into the repository):

1. **Spans** — every ``dynamic/`` prompt of ``system_prompts/manifest.jsonl`` is instantiated many
   times: each labelled span gets same-shape replacement values at the rate of its churn
   (per-request: every request; per-day: one value per simulated day; per-user/session: one per
   simulated user; template slots are filled per their meaning; per-release/config and per-year
   spans stay constant within the trace — they do not vary per request). Each request gets its own
   user turn. Every ``static/`` prompt is repeated with varied user turns. All requests are
   shuffled into one trace and audited in-process with the default tokenizer and ChatML.
   *Recall* = labelled per-request/per-day/per-user/session spans that vary in the trace and are
   overlapped by a finding of an acceptable kind (``ACCEPT`` below; there is no "location" kind, so
   locations may be ``name`` or ``other``). *False findings* = findings on a static prompt's
   template plus findings that overlap no varying labelled span.
2. **Chat templates** — each ``chat_templates/*.jinja`` renders static messages (system+user,
   user only, system+user+tools); the row says whether the auditor reports a role ``template``
   date finding and whether that matches the data README (which templates call ``strftime_now``
   and print it).

3. **Generated traces** (``gen_traces.py``, scored by ``eval_generated.py``): the held-out seeds
   of issue 19 (tuning was done on seeds 0-9 only).
4. **Independent traces** (``gen_traces_independent.py``, scored by ``eval_independent.py``,
   which runs ``prefix-audit`` as a user does): a second generator written apart from the one
   the auditor was tuned on; its held-out seeds (tuning used 101-106 only).

Usage: ``python scripts/eval_auditor.py [--data ../shared/data] [--requests 40] [--json]
[--generated-seeds 1000 1001 ...] [--independent-seeds 7001 7002 ...]``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import eval_independent
from eval_generated import HELD_OUT_SEEDS, evaluate, print_summary, summarise

from templates_audit.analysis import Auditor
from templates_audit.model import Finding, Report
from templates_audit.render import ChatRenderer, TemplateError
from templates_audit.report import json_report
from templates_audit.tokenize import Tokenizer, TokenizerError, load_tokenizer
from templates_audit.traces import Record

RECALL_CHURN = ("per-request", "per-day", "per-user/session")
CONSTANT_CHURN = ("per-release/config", "per-year")

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
COUNTRIES = ["Italy", "France", "Iceland", "Germany", "Spain", "Japan", "Brazil", "Canada",
             "Kenya", "Norway", "Portugal", "Mexico", "United States", "United Kingdom", "India"]
CITIES = ["Redmond", "Austin", "Lyon", "Osaka", "Porto", "Nairobi", "Bergen", "Leeds",
          "Denver", "Turin", "Seville", "Graz", "Quebec", "Pune"]
STATES = ["Washington", "Texas", "Oregon", "Ohio", "Bavaria", "Ontario", "England", "Scotland"]
TIMEZONES = ["Atlantic/Reykjavik", "Europe/Paris", "America/New_York", "Asia/Tokyo",
             "Europe/Berlin", "America/Denver", "Africa/Nairobi", "Australia/Sydney"]
LANGUAGES = ["english", "french", "german", "spanish", "italian", "japanese", "portuguese"]
LOCALES = ["en-US", "fr-FR", "de-DE", "es-ES", "it-IT", "ja-JP", "pt-BR", "en-GB"]
NAMES = ["Alice", "Bruno", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiro", "Ines",
         "Jonas", "Kemi", "Lukas", "Mara", "Nils", "Olga", "Priya"]
SURNAMES = ["Rossi", "Martin", "Nakamura", "Okafor", "Silva", "Novak", "Berg", "Khan"]
WORDS = ["invoice", "garden", "meeting", "travel", "recipe", "budget", "launch", "review",
         "update", "reminder", "offer", "ticket", "report", "deadline"]
MODELS = ["gpt-4o", "claude-sonnet-4", "gemini-2.5-pro", "llama-3.1-70b", "qwen3-32b"]
USER_TURNS = ["How do I reverse a list in Python?", "Summarise the plot of Hamlet.",
              "What is the capital of Australia?", "Write a haiku about autumn.",
              "Explain TCP slow start briefly.", "Translate 'good morning' to French.",
              "Give me three ideas for a birthday party.", "What is 17 * 23?"]

# Labelled kind (substring, lowercase) -> auditor kinds that count as right. First match wins.
ACCEPT: list[tuple[str, frozenset[str]]] = [
    ("injected", frozenset({"other", "name", "date", "time", "timestamp", "numeric_id",
                            "hex_id", "uuid", "email", "version", "reordered_block"})),
    ("uuid", frozenset({"uuid", "hex_id"})),
    ("thread id", frozenset({"uuid", "hex_id"})),
    ("turn counter", frozenset({"numeric_id", "other"})),
    ("email", frozenset({"email", "name"})),
    ("incl. node version", frozenset({"version", "other", "name"})),  # path holding a version
    ("path", frozenset({"other", "name"})),
    ("memory", frozenset({"date", "timestamp"})),
    ("datetime", frozenset({"timestamp", "time", "date"})),
    ("time placeholder", frozenset({"timestamp", "time"})),
    ("timezone", frozenset({"name", "other", "time"})),
    ("date", frozenset({"date", "timestamp"})),
    ("year", frozenset({"date"})),
    ("os", frozenset({"version", "other", "name"})),
    ("version", frozenset({"version", "other"})),
    ("path", frozenset({"other", "name"})),
    ("cwd", frozenset({"other", "name"})),
    ("name", frozenset({"name", "other"})),
    ("", frozenset({"name", "other"})),  # location, country, language, locale, region, ...
]

PLACEHOLDER = re.compile(
    r"\{\{[^}]*\}\}|\$\{[^}]*\}|\{[A-Z_]+\}|\{\}|_{3,}|\[REDACTED_CITY\]|\[Server Name\]"
    r"|\(Selected model name\)|REDACTED_USER|GOOGLE_ACCOUNT_NAME|HANDLE|@User1"
)


def _slot_value(kind: str, ph: str, rng: random.Random) -> str:
    k = kind.lower() + " " + ph.lower()
    if "commit" in k:
        return "\n".join(f"{rng.getrandbits(28):07x} {rng.choice(WORDS)} fix" for _ in range(5))
    if "cwd" in k or "directory" in k:
        return f"/home/{rng.choice(NAMES).lower()}/src/{rng.choice(WORDS)}"
    if "redacted_user" in k:
        return rng.choice(NAMES).lower()
    if "model" in k:
        return rng.choice(MODELS)
    if "region" in k:
        return rng.choice(["Europe", "America", "Asia"])
    if "city" in k or "location" in k:
        return rng.choice(CITIES)
    if "timezone" in k:
        return rng.choice(TIMEZONES)
    if "email" in k and ph == "HANDLE":
        return rng.choice(NAMES).lower() + str(rng.randint(1, 99))
    if "name" in k or "server" in k or "participant" in k or "user" in k:
        return rng.choice(NAMES)
    if "time" in k and "date" not in k:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    if "datetime" in k or "currentdatetime" in k:
        return (f"{rng.choice(WEEKDAYS)}, {rng.choice(MONTHS)} {rng.randint(1, 28)}, "
                f"{rng.randint(2023, 2026)} {rng.randint(1, 12)}:{rng.randint(0, 59):02d} PM")
    if "date" in k:
        return f"{rng.randint(2023, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return rng.choice(NAMES)


def _digits(m: re.Match[str], rng: random.Random) -> str:
    d = m.group()
    n = len(d)
    if n == 4 and d[:2] in ("19", "20"):
        return str(rng.randint(2019, 2027))
    if n == 13:
        return "17" + "".join(rng.choice(string.digits) for _ in range(11))
    if n <= 2:
        v = rng.randint(1, 28)
        return f"{v:02d}" if n == 2 else str(v % 10 or 1)
    return str(rng.randint(1, 9)) + "".join(rng.choice(string.digits) for _ in range(n - 1))


def _iso(m: re.Match[str], rng: random.Random) -> str:
    d = f"{rng.randint(2019, 2027)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    rest = m.group()[10:]
    if rest:
        t = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        rest = rest[0] + t + (f":{rng.randint(0, 59):02d}" if rest.count(":") >= 2 else "")
    return d + rest


def _clock(m: re.Match[str], rng: random.Random) -> str:
    g = m.group()
    short = len(g.split(":")[0]) == 1
    hour = rng.randint(1, 12) if short else rng.randint(0, 23)
    out = (f"{hour}" if short else f"{hour:02d}") + f":{rng.randint(0, 59):02d}"
    return out + (f":{rng.randint(0, 59):02d}" if g.count(":") == 2 else "")


def _us_date(m: re.Match[str], rng: random.Random) -> str:
    return f"{rng.randint(1, 12):02d}/{rng.randint(1, 28):02d}/{rng.randint(2019, 2027)}"


def _choice(values: list[str]) -> Any:
    return lambda m, rng: rng.choice(values)


def _words(ws: list[str]) -> str:
    return r"\b(?:" + "|".join(re.escape(w) for w in sorted(ws, key=len, reverse=True)) + r")\b"


# One pass over the span with every rule as an alternative, so no rule rewrites another's output.
RULES: list[tuple[str, Any]] = [
    (r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?", _iso),
    (r"\d{1,2}/\d{1,2}/\d{4}", _us_date),
    (r"\d{2}-\d{2}-\d{4}",
     lambda m, rng: f"{rng.randint(1, 28):02d}-{rng.randint(1, 12):02d}-{rng.randint(2019, 2027)}"),
    (r"\b\d{1,2}:\d{2}(?::\d{2})?\b", _clock),
    (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
     lambda m, rng: str(uuid.UUID(int=rng.getrandbits(128)))),
    *((_words(ws), _choice(ws)) for ws in (
        WEEKDAYS, [w[:3] for w in WEEKDAYS], MONTHS, [m[:3] for m in MONTHS], COUNTRIES, CITIES,
        STATES, TIMEZONES, LANGUAGES, LOCALES, ["US", "UK", "FR", "DE"])),
    (r"\d+", lambda m, rng: _digits(m, rng)),
]
ANY_RULE = re.compile("|".join(f"(?P<r{i}>{pat})" for i, (pat, _) in enumerate(RULES)))


def vary(text: str, kind: str, rng: random.Random) -> str:
    """A same-shape replacement of a labelled span (see the module docstring)."""
    def one(m: re.Match[str]) -> str:
        fn = RULES[int(str(m.lastgroup)[1:])][1]
        return str(fn(m, rng))

    parts = []
    pos = 0
    for m in PLACEHOLDER.finditer(text):  # fill slots; vary the literal text around them
        parts.append(ANY_RULE.sub(one, text[pos:m.start()]))
        parts.append(_slot_value(kind, m.group(), rng))
        pos = m.end()
    parts.append(ANY_RULE.sub(one, text[pos:]))
    out = "".join(parts)
    if out == text:  # nothing recognisable: swap the last word for another
        words = list(re.finditer(r"[A-Za-z]{3,}", text))
        if words:
            w = words[-1]
            out = text[:w.start()] + rng.choice(WORDS) + rng.choice(["", "s", "ed"]) + text[w.end():]
    return out


@dataclass
class Label:
    text: str
    kind: str
    churn: str

    @property
    def recall_class(self) -> bool:
        return self.churn in RECALL_CHURN

    @property
    def varies(self) -> bool:
        return self.churn not in CONSTANT_CHURN


@dataclass
class Instance:
    file: str
    system: str
    spans: list[tuple[int, int, int]]  # (start, end, label index) in `system`


def instantiate(text: str, labels: list[Label], file: str, day: int, user: int, req: int,
                seed: int) -> Instance:
    occ: list[tuple[int, int, int]] = []
    for li, lab in enumerate(labels):
        pos = text.find(lab.text)
        while pos >= 0:
            occ.append((pos, pos + len(lab.text), li))
            pos = text.find(lab.text, pos + 1)
    occ.sort()
    kept: list[tuple[int, int, int]] = []
    for o in occ:
        if not kept or o[0] >= kept[-1][1]:
            kept.append(o)
    parts: list[str] = []
    spans: list[tuple[int, int, int]] = []
    pos = 0
    cur = 0
    for s, e, li in kept:
        parts.append(text[pos:s])
        cur += s - pos
        lab = labels[li]
        churn = lab.churn
        if churn == "template-slot":
            k = lab.kind.lower()
            churn = ("per-day" if "date" in k and "time" not in k else
                     "per-request" if "time" in k or "commit" in k else "per-user/session")
        key = {"per-request": req, "per-day": day, "per-user/session": user}.get(churn)
        value = lab.text if key is None else vary(lab.text, lab.kind,
                                                  random.Random(f"{seed}:{file}:{li}:{churn}:{key}"))
        parts.append(value)
        spans.append((cur, cur + len(value), li))
        cur += len(value)
        pos = e
    parts.append(text[pos:])
    return Instance(file, "".join(parts), spans)


def accept(kind_label: str) -> frozenset[str]:
    low = kind_label.lower()
    return next(kinds for key, kinds in ACCEPT if key in low)


def eval_spans(data: Path, requests: int, seed: int, tokenizer: Tokenizer | None = None,
               report_out: Path | None = None) -> dict[str, Any]:
    root = data / "system_prompts"
    manifest = [json.loads(line) for line in (root / "manifest.jsonl").open()]
    rng = random.Random(seed)
    trace: list[tuple[Record, Instance, str]] = []
    labels_of: dict[str, list[Label]] = {}
    for item in manifest:
        text = (root / item["file"]).read_text(encoding="utf-8")
        labels = [Label(d["text"], d["kind"], d["churn"]) for d in item.get("dynamic_substrings", [])]
        labels_of[item["file"]] = labels
        n = requests if item["category"] == "dynamic" else max(requests // 2, 5)
        for r in range(n):
            day, user = rng.randrange(10), rng.randrange(25)
            inst = instantiate(text, labels, item["file"], day, user, r, seed)
            trace.append((Record("", 0, messages=[
                {"role": "system", "content": inst.system},
                {"role": "user", "content": f"{rng.choice(USER_TURNS)} (#{rng.randrange(10**6)})"},
            ]), inst, item["category"]))
    rng.shuffle(trace)
    renderer = ChatRenderer()
    auditor = Auditor(tokenizer, renderer=renderer)
    by_line: dict[int, tuple[Instance, str]] = {}
    for i, (rec, inst, cat) in enumerate(trace, 1):
        by_line[i] = (inst, cat)
        auditor.add(Record("eval", i, messages=rec.messages))
    report = auditor.report()
    if report_out is not None:
        report_out.write_text(json_report.render(report), encoding="utf-8")
    return score(report, by_line, labels_of, renderer)


def score(report: Report, by_line: dict[int, tuple[Instance, str]],
          labels_of: dict[str, list[Label]], renderer: ChatRenderer) -> dict[str, Any]:
    findings_by_tpl: dict[str, list[Finding]] = defaultdict(list)
    for f in report.findings:
        findings_by_tpl[f.template].append(f)
    found: dict[tuple[str, int], set[str]] = defaultdict(set)  # (file, label) -> kinds overlapping
    false_static: list[Finding] = []
    false_unlabelled: list[tuple[str, Finding]] = []
    templates_of: dict[str, set[str]] = defaultdict(set)
    for t in report.templates:
        line = int(t.reference.rsplit(":", 1)[1])
        inst, cat = by_line[line]
        templates_of[inst.file].add(t.id)
        fs = findings_by_tpl.get(t.id, [])
        if cat == "static":
            false_static.extend(fs)
            continue
        rendered = renderer.render([{"role": "system", "content": inst.system},
                                    {"role": "user", "content": "x"}])
        off = rendered.find(inst.system)
        labels = labels_of[inst.file]
        for f in fs:
            hit = False
            for s, e, li in inst.spans:
                ls, le = off + s, off + e
                if f.char_start < le and ls < max(f.char_end, f.char_start + 1) and labels[li].varies:
                    found[(inst.file, li)].add(f.kind)
                    hit = True
            if not hit:
                false_unlabelled.append((inst.file, f))
    rows: list[dict[str, Any]] = []
    for file, labels in labels_of.items():
        for li, lab in enumerate(labels):
            if not lab.varies:
                continue
            kinds = found.get((file, li), set())
            ok = bool(kinds & accept(lab.kind))
            rows.append({"file": file, "label": lab.text[:70], "kind": lab.kind, "churn": lab.churn,
                         "found": sorted(kinds), "ok": ok, "overlap": bool(kinds)})
    main_rows = [r for r in rows if r["churn"] in RECALL_CHURN]
    slot_rows = [r for r in rows if r["churn"] == "template-slot"]
    dyn_files = {f for f, labs in labels_of.items() if labs}
    return {
        "requests": report.summary.requests,
        "templates": report.summary.templates,
        "prompts": len(labels_of),
        "dynamic_prompts_split": sum(1 for f in dyn_files if len(templates_of[f]) > 1),
        "recall": sum(r["ok"] for r in main_rows) / max(len(main_rows), 1),
        "recall_any_kind": sum(r["overlap"] for r in main_rows) / max(len(main_rows), 1),
        "labelled_spans": len(main_rows),
        "recall_template_slots": sum(r["ok"] for r in slot_rows) / max(len(slot_rows), 1),
        "template_slot_spans": len(slot_rows),
        "false_findings_static": len(false_static),
        "false_findings_unlabelled": len(false_unlabelled),
        "findings": len(report.findings),
        "observed_hit_rate": report.summary.observed_hit_rate,
        "achievable_hit_rate": report.summary.achievable_hit_rate,
        "misses": [r for r in main_rows + slot_rows if not r["ok"]],
        "false": [{"file": file, "kind": f.kind, "example": f.examples[:1], "before": f.before[-30:]}
                  for file, f in false_unlabelled]
                 + [{"file": "static", "kind": f.kind, "example": f.examples[:1],
                     "before": f.before[-30:]} for f in false_static],
    }


# Expected from the data README: (template file, scenario) -> the template injects a date.
INJECTS = {
    ("meta-llama__Llama-3.2-11B-Vision-Instruct.jinja", "system+user"),
    ("meta-llama__Llama-3.2-11B-Vision-Instruct.jinja", "user"),
    ("meta-llama__Llama-3.2-11B-Vision-Instruct.jinja", "system+user+tools"),
    ("HuggingFaceTB__SmolLM3-3B.jinja", "system+user"),
    ("HuggingFaceTB__SmolLM3-3B.jinja", "user"),
    ("HuggingFaceTB__SmolLM3-3B.jinja", "system+user+tools"),
    ("LiquidAI__LFM2.5-VL-450M.jinja", "system+user+tools"),
    ("axolotl__mistral_v7_tekken.jinja", "user"),
    ("mistralai__Mistral-Small-3.1-24B-Instruct-2503.jinja", "user"),
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
SYSTEM = ("You are a meticulous support assistant for a bicycle shop. Answer politely, cite the "
          "warranty policy when relevant, and never invent prices. " * 6).strip()


def eval_templates(data: Path, requests: int, tokenizer: Tokenizer | None = None
                   ) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((data / "chat_templates").glob("*.jinja")):
        for scenario in ("system+user", "user", "system+user+tools"):
            renderer = ChatRenderer(path.read_text(encoding="utf-8"), bos_token="<s>",
                                    eos_token="</s>")
            auditor = Auditor(tokenizer, renderer=renderer)
            for i in range(requests):
                msgs = [{"role": "user", "content": f"{USER_TURNS[i % len(USER_TURNS)]} #{i}"}]
                if scenario != "user":
                    msgs.insert(0, {"role": "system", "content": SYSTEM})
                rec = Record(path.name, i + 1, messages=msgs,
                             tools=TOOLS if scenario.endswith("tools") else None)
                auditor.add(rec)
            report = auditor.report()
            got = [f for f in report.findings if f.role.value == "template"]
            expected = (path.name, scenario) in INJECTS
            rows.append({
                "template": path.name, "scenario": scenario, "expected": expected,
                "found": bool(got), "kinds": sorted({f.kind for f in got}),
                "other_findings": len(report.findings) - len(got),
                "render_errors": report.summary.bad_lines,
                "ok": bool(got) == expected,
                "error": report.bad_line_samples[0].error[:80] if report.bad_line_samples else "",
            })
    return rows


def _default_data() -> Path:
    """``../shared/data`` next to the repository (a worktree under ``wt/`` looks one up more)."""
    root = Path(__file__).resolve().parents[1]
    for base in (root.parent, root.parent.parent):
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return root.parent / "shared" / "data"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(_default_data()))
    p.add_argument("--requests", type=int, default=40, help="requests per dynamic prompt")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="audit with this tokenizer.json (default: the built-in tokenizer)")
    p.add_argument("--full-encode", action="store_true",
                   help="with --tokenizer: encode every prompt whole (the cross-check)")
    p.add_argument("--report", type=Path, metavar="FILE",
                   help="write the span evaluation's JSON report (prefix-audit --format json)")
    p.add_argument("--generated-seeds", type=int, nargs="*", default=list(HELD_OUT_SEEDS),
                   help="seeds of the held-out generated traces (gen_traces.py); none: skip")
    p.add_argument("--independent-seeds", type=int, nargs="*",
                   default=list(eval_independent.HELD_OUT_SEEDS),
                   help="seeds of the held-out independent traces (gen_traces_independent.py); "
                        "none: skip")
    args = p.parse_args(argv)
    data = Path(args.data)
    if not (data / "system_prompts" / "manifest.jsonl").exists():
        print(f"no evaluation data under {data}", file=sys.stderr)
        return 2
    try:
        tokenizer = load_tokenizer(args.tokenizer, incremental=not args.full_encode)
    except TokenizerError as exc:
        print(f"eval_auditor: {exc}", file=sys.stderr)
        return 2
    try:
        spans = eval_spans(data, args.requests, args.seed, tokenizer, args.report)
        tmpl = eval_templates(data, 6, tokenizer)
    except TemplateError as exc:
        print(f"render failure: {exc}", file=sys.stderr)
        return 1
    generated = (summarise([evaluate(seed) for seed in args.generated_seeds])
                 if args.generated_seeds else None)
    independent = (eval_independent.summarise(eval_independent.evaluate(args.independent_seeds))
                   if args.independent_seeds else None)
    if args.json:
        print(json.dumps({"spans": spans, "chat_templates": tmpl, "generated": generated,
                          "independent": independent}, indent=2))
        return 0
    if generated is not None:
        print_summary(generated)
    if independent is not None:
        eval_independent.print_summary(independent)
    print(f"span eval: {spans['requests']} requests, {spans['prompts']} prompts, "
          f"{spans['templates']} templates ({spans['dynamic_prompts_split']} dynamic prompts split)")
    print(f"  recall (right kind) {spans['recall']:.3f} over {spans['labelled_spans']} "
          f"per-request/per-day/per-user spans; any kind {spans['recall_any_kind']:.3f}")
    print(f"  template slots recall {spans['recall_template_slots']:.3f} over "
          f"{spans['template_slot_spans']}")
    print(f"  false findings: {spans['false_findings_static']} on static prompts, "
          f"{spans['false_findings_unlabelled']} not overlapping a label "
          f"(of {spans['findings']} findings)")
    print(f"  hit rate observed {spans['observed_hit_rate']:.3f} achievable "
          f"{spans['achievable_hit_rate']:.3f}")
    for m in spans["misses"]:
        print(f"  MISS {m['file']}: {m['label']!r} [{m['kind']}, {m['churn']}] found={m['found']}")
    for f in spans["false"]:
        print(f"  FALSE {f['file']}: {f['kind']} {f['example']} after {f['before']!r}")
    ok = sum(r["ok"] for r in tmpl)
    print(f"chat templates: {ok}/{len(tmpl)} rows as expected")
    for r in tmpl:
        mark = "ok " if r["ok"] else "BAD"
        print(f"  {mark} {r['template']:<55} {r['scenario']:<18} expected={r['expected']!s:<5} "
              f"found={r['found']!s:<5} {','.join(r['kinds'])} other={r['other_findings']} "
              f"errors={r['render_errors']} {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
