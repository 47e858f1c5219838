#!/usr/bin/env python3
"""Benchmark ``prefix-audit``: throughput (requests/s) and peak memory vs trace length.

Synthetic trace: ``--templates`` system prompts of ~2k default-tokenizer tokens each (numbered
rules): 40 % static, 25 % with a per-day date, 20 % with a per-user name, 15 % with a per-request
timestamp near the top (``MIX``); every request has its own user turn
(``--user-turns``: numbers or words, see :func:`user_turn`). Lines are JSONL chat bodies.

* ``throughput``: writes ``--requests`` lines to a temp file, then times what the CLI does —
  stream + parse (:func:`iter_trace`) and :class:`Auditor` (render, tokenise, group, diff, both
  caches) — on one core; then the same with ``--tokenizer`` (a byte-level BPE trained here with
  the ``tokenizers`` library on the synthetic text, vocab 4,096), on fewer requests.
* ``memory N``: in a fresh subprocess, audits N generated lines (parsed from JSON bytes, never
  stored) and prints peak RSS; the parent compares two sizes.
* ``rag``: two RAG traces (``--rag`` requests each; :func:`rag_lines`; paragraphs of the real
  system prompts in ``../shared`` when present, ``--rag-corpus``): retrieved paragraphs
  between a fixed preamble and fixed rules, and retrieved paragraphs closing the system prompt;
  in a fresh subprocess each: requests/s, templates, findings, hit rates, peak RSS.
* ``by kind``: in a fresh subprocess (the module-level line caches empty, as in a CLI run;
  in this process they are warm from the throughput run), parsing cost per request, then the
  audit cost per request by template kind (records in memory), so a change can be attributed.

Usage: ``python scripts/bench_auditor.py [--requests 20000] [--memory 10000 100000]``.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from loadtest.workloads import synthetic_text
from templates_audit.analysis import DEFAULT_CACHE_BLOCKS, Auditor
from templates_audit.tokenize import load_tokenizer
from templates_audit.traces import iter_trace, parse_record

NAMES = ["Alice", "Bruno", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiro"]
TOPICS = ["billing", "shipping", "returns", "warranty", "accounts", "security", "pricing"]


def system_prompt(t: int) -> str:
    rules = "\n".join(
        f"Rule {t}.{i}: when the customer asks about {TOPICS[(t + i) % len(TOPICS)]}, explain "
        f"the policy in plain words, cite section {i} of the handbook and offer further help."
        for i in range(50)
    )
    return f"You are support assistant #{t} of ACME Corp.\n{{volatile}}\n{rules}\nBe concise."


# Share of templates per volatility pattern: a realistic mix, most of the cost is in the last one.
MIX = (("static", 0.40), ("per-day date", 0.25), ("per-user name", 0.20),
       ("per-request timestamp", 0.15))


def volatile(kind: str, i: int, n: int, rng: random.Random) -> str:
    day = i * 30 // max(n, 1)
    if kind == "per-day date":
        return f"Current date: 2025-{day // 28 + 1:02d}-{day % 28 + 1:02d}"
    if kind == "per-user name":
        return f"The user's name is {rng.choice(NAMES)}."
    if kind == "per-request timestamp":
        return f"Request time: 2025-05-20T{rng.randrange(24):02d}:{rng.randrange(60):02d}:" \
               f"{rng.randrange(60):02d}Z"
    return "Follow the rules below."


def template_kinds(templates: int, mix: tuple[tuple[str, float], ...] = MIX) -> list[str]:
    """The volatility pattern of each template (index = the ``#t`` in its system prompt)."""
    kinds = [k for k, share in mix for _ in range(round(share * templates))]
    return kinds + [mix[0][0]] * (templates - len(kinds))


def user_turn(i: int, rng: random.Random, style: str) -> str:
    """``numbers``: the same question with a request number and an order number (a line that
    differs from the others only in digits, which the tokenizer assembles from the line's
    shape); ``words``: 12 random common words (a new line of known words: a regex pass)."""
    if style == "words":
        return synthetic_text(rng, 12, line_words=12)
    return f"Question {i}: what about my order {rng.randrange(10**6)}?"


def lines(n: int, templates: int, seed: int = 1, mix: tuple[tuple[str, float], ...] = MIX,
          user: str = "numbers") -> Iterator[bytes]:
    rng = random.Random(seed)
    prompts = [system_prompt(t) for t in range(templates)]
    kinds = template_kinds(templates, mix)
    for i in range(n):
        t = rng.randrange(templates)
        system = prompts[t].replace("{volatile}", volatile(kinds[t], i, n, rng))
        body = {"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user_turn(i, rng, user)},
        ]}
        yield json.dumps(body).encode() + b"\n"


def train_tokenizer(path: Path, templates: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator([system_prompt(t) for t in range(templates)], trainer=trainer)
    tok.save(str(path))


def audit_file(path: Path, tokenizer: str | None) -> tuple[int, float, float]:
    """(requests, CPU seconds, mean prompt tokens). CPU time of this process: the shared cores
    this runs on are busy, so wall time measures the neighbours as much as the auditor."""
    auditor = Auditor(load_tokenizer(tokenizer), cache_blocks=DEFAULT_CACHE_BLOCKS)
    start = time.process_time()
    auditor.add_all(iter_trace([str(path)]))
    report = auditor.report()
    elapsed = time.process_time() - start
    return report.summary.requests, elapsed, report.summary.prompt_tokens / max(report.summary.requests, 1)


def by_kind(n: int, templates: int, user: str = "numbers"
            ) -> tuple[float, dict[str, tuple[int, float]]]:
    """CPU µs per request of parsing, and of ``Auditor.add`` by template kind (records parsed
    beforehand, so in memory; each add timed on its own, which adds ~1 µs of clock reads)."""
    raws = list(lines(n, templates, user=user))
    start = time.process_time()
    records = [parse_record(raw[:-1], "kind", i + 1) for i, raw in enumerate(raws)]
    parse_us = (time.process_time() - start) / n * 1e6
    kinds = template_kinds(templates)
    auditor = Auditor(cache_blocks=DEFAULT_CACHE_BLOCKS)
    spent: dict[str, float] = {}
    count: dict[str, int] = {}
    clock = time.process_time
    for rec in records:
        system = (rec.messages or [{}])[0].get("content", "")
        kind = kinds[int(system.split("#", 1)[1].split(" ", 1)[0])]
        t0 = clock()
        auditor.add(rec)
        spent[kind] = spent.get(kind, 0.0) + clock() - t0
        count[kind] = count.get(kind, 0) + 1
    return parse_us, {k: (count[k], spent[k] / count[k] * 1e6) for k, _ in MIX if k in count}


def lazy_vs_exact(n: int, templates: int, user: str = "numbers"
                  ) -> tuple[float, float, float, float]:
    """Observed/achievable hit rates with the lazy head refresh and with every block inserted."""
    out = []
    for exact in (False, True):
        auditor = Auditor(cache_blocks=DEFAULT_CACHE_BLOCKS, exact_replay=exact)
        for i, raw in enumerate(lines(n, templates, user=user)):
            auditor.add(parse_record(raw[:-1], "cmp", i + 1))
        s = auditor.report().summary
        out += [s.observed_hit_rate, s.achievable_hit_rate]
    return out[0], out[1], out[2], out[3]


def peak_rss_kib() -> int:
    """Peak RSS of this process image. ``VmHWM``, not ``ru_maxrss``: Linux carries ru_maxrss
    across fork+exec, so a child would report its parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def memory_child(n: int, templates: int, user: str = "numbers") -> None:
    auditor = Auditor(cache_blocks=DEFAULT_CACHE_BLOCKS)
    for i, raw in enumerate(lines(n, templates, user=user)):
        auditor.add(parse_record(raw[:-1], "mem", i + 1))
        if (i + 1) % 100_000 == 0:  # the curve, not just the end point
            print(f"# {i + 1} requests: peak RSS {peak_rss_kib() / 1024:.0f} MiB", file=sys.stderr,
                  flush=True)
    report = auditor.report()
    print(json.dumps({"requests": report.summary.requests, "peak_rss_mib": peak_rss_kib() / 1024,
                      "templates": report.summary.templates, "findings": len(report.findings)}))


SHARED_PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "system_prompts"


def rag_corpus(rng: random.Random, corpus: Path | None) -> list[str]:
    """Paragraphs to retrieve: those of 200-1,500 characters of the real system prompts under
    ``corpus`` (multi-line prose, lists, code), else 400 synthetic one-line paragraphs."""
    if corpus is not None and corpus.is_dir():
        paras = [para for f in sorted(corpus.glob("*/*.txt"))
                 for para in f.read_text(encoding="utf-8").split("\n\n") if 200 < len(para) < 1500]
        if paras:
            return paras
    return [synthetic_text(rng, rng.randrange(30, 90), line_words=100) for _ in range(400)]


def rag_lines(n: int, rules: bool, corpus: Path | None = None, seed: int = 3) -> Iterator[bytes]:
    """A RAG trace: one fixed two-line preamble, 2-5 retrieved paragraphs (:func:`rag_corpus`)
    after ``Context:``, then 20 fixed rules (``rules``) or nothing."""
    rng = random.Random(seed)
    corpus_paras = rag_corpus(rng, corpus)
    head = ("You are ACME's retrieval assistant. Answer only from the context below.\n"
            "Cite the passage you used; say so when the context does not hold the answer.\n")
    tail = "\n\nRules:\n" + "\n".join(
        f"Rule {k}: be polite, cite the passage and never guess about {TOPICS[k % 7]}."
        for k in range(20)) if rules else ""
    for i in range(n):
        docs = "\n\n".join(rng.sample(corpus_paras, rng.randrange(2, 6)))
        body = {"model": "m", "messages": [
            {"role": "system", "content": f"{head}\nContext:\n{docs}{tail}"},
            {"role": "user", "content": user_turn(i, rng, "numbers")},
        ]}
        yield json.dumps(body).encode() + b"\n"


def rag_child(n: int, rules: bool, corpus: Path | None) -> None:
    auditor = Auditor(cache_blocks=DEFAULT_CACHE_BLOCKS)
    records = [parse_record(raw[:-1], "rag", i + 1)
               for i, raw in enumerate(rag_lines(n, rules, corpus))]
    start = time.process_time()
    auditor.add_all(records)
    report = auditor.report()
    secs = time.process_time() - start
    s = report.summary
    print(json.dumps({"requests": s.requests, "requests_per_s": s.requests / secs,
                      "peak_rss_mib": peak_rss_kib() / 1024, "templates": s.templates,
                      "findings": len(report.findings), "observed": s.observed_hit_rate,
                      "achievable": s.achievable_hit_rate,
                      "tokens": s.prompt_tokens / max(s.requests, 1)}))


def _child(flag: str, n: int, args: argparse.Namespace) -> str:
    """Stdout of this script run in a fresh process with ``flag n`` and the same trace options."""
    return subprocess.run([sys.executable, __file__, flag, str(n), "--templates",
                           str(args.templates), "--user-turns", args.user_turns],
                          capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--hf-requests", type=int, default=5000)
    p.add_argument("--templates", type=int, default=30)
    p.add_argument("--user-turns", choices=("numbers", "words"), default="numbers",
                   help="what varies in each request's user turn (see user_turn)")
    p.add_argument("--memory", type=int, nargs="*", default=[10000, 100000])
    p.add_argument("--compare", type=int, default=5000,
                   help="requests for the lazy-vs-exact replay comparison")
    p.add_argument("--by-kind", type=int, default=20000,
                   help="requests for the per-template-kind cost breakdown (0: skip)")
    p.add_argument("--rag", type=int, default=2000,
                   help="requests of each RAG trace (retrieved paragraphs; 0: skip)")
    p.add_argument("--rag-corpus", type=Path, default=SHARED_PROMPTS,
                   help="system prompts whose paragraphs are retrieved (synthetic text if absent)")
    p.add_argument("--rag-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rag-rules", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--by-kind-child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        memory_child(args.memory_child, args.templates, args.user_turns)
        return 0
    if args.rag_child:
        rag_child(args.rag_child, bool(args.rag_rules), args.rag_corpus)
        return 0
    if args.by_kind_child:
        parse_us, kinds = by_kind(args.by_kind_child, args.templates, args.user_turns)
        per = " · ".join(f"{k} {us:,.0f} µs ({c:,})" for k, (c, us) in kinds.items())
        print(f"per request, in memory, {args.by_kind_child:,} requests (fresh process): parsing "
              f"{parse_us:,.0f} µs; audit by template kind: {per}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        with trace.open("wb") as fh:
            fh.writelines(lines(args.requests, args.templates, user=args.user_turns))
        size = trace.stat().st_size
        n, secs, avg = audit_file(trace, None)
        print(f"default tokenizer: {n:,} requests (~{avg:,.0f} tokens each, {size / 2**20:,.0f} MiB, "
              f"user turns: {args.user_turns}) in {secs:.2f} CPU s = {n / secs:,.0f} requests/s")
        try:
            tok = Path(tmp) / "tokenizer.json"
            train_tokenizer(tok, args.templates)
        except ImportError:
            print("--tokenizer: skipped (the optional 'tokenizers' package is not installed)")
        else:
            small = Path(tmp) / "small.jsonl"
            with small.open("wb") as fh:
                fh.writelines(lines(args.hf_requests, args.templates, user=args.user_turns))
            n, secs, avg = audit_file(small, str(tok))
            print(f"--tokenizer (BPE, vocab 4,096): {n:,} requests (~{avg:,.0f} tokens each) in "
                  f"{secs:.2f} CPU s = {n / secs:,.0f} requests/s")
    if args.by_kind:
        print(_child("--by-kind-child", args.by_kind, args).strip())
    lo, la, eo, ea = lazy_vs_exact(args.compare, args.templates, args.user_turns)
    print(f"bounded pool, {args.compare:,} requests: lazy head refresh observed {lo:.5f} / "
          f"achievable {la:.5f}; every block inserted {eo:.5f} / {ea:.5f}")
    for rules in (1, 0) if args.rag else ():
        out = subprocess.run([sys.executable, __file__, "--rag-child", str(args.rag),
                              "--rag-rules", str(rules), "--rag-corpus", str(args.rag_corpus)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        where = "rules after the documents" if rules else "documents last"
        print(f"RAG, {where}: {r['requests']:,} requests (~{r['tokens']:,.0f} tokens each) at "
              f"{r['requests_per_s']:,.0f} requests/s (in memory, fresh process), "
              f"{r['templates']:,} templates, {r['findings']} findings, hit rate observed "
              f"{r['observed']:.3f} / achievable {r['achievable']:.3f}, peak RSS "
              f"{r['peak_rss_mib']:,.0f} MiB")
    for n in args.memory:
        stats = json.loads(_child("--memory-child", n, args))
        print(f"memory: {stats['requests']:,} requests -> peak RSS {stats['peak_rss_mib']:,.0f} MiB "
              f"({stats['templates']} templates, {stats['findings']} findings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
