#!/usr/bin/env python3
"""Check that the incremental tokenizer's JSON reports equal the full-encode path's, byte for byte.

Issue 25's cross-check of ``prefix-audit --tokenizer`` against ``--tokenizer ... --full-encode``
(every prompt encoded whole by the ``tokenizers`` library), on two inputs:

* **the bench trace**: :func:`bench_auditor.lines` (``--requests``, numbers and words user
  turns) audited by the CLI itself (``python -m templates_audit --format json``, a subprocess
  per run) with the byte-level BPE :func:`bench_auditor.train_tokenizer` trains;
* **the ../shared evaluation** (when present): the span-evaluation trace of
  ``scripts/eval_auditor.py`` (every ``system_prompts`` prompt, ``--eval-requests`` per dynamic
  prompt), its ``--report`` JSON, with the bench BPE and each tokenizer family of
  ``--families`` (trained by ``tests/templates_audit/tokenizer_families.py``).

Prints one line per comparison (sha256 of both reports) and exits 1 if any pair differs.
Usage: ``python scripts/check_report_identity.py [--requests 5000] [--eval-requests 40]``.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_auditor import lines, train_tokenizer  # noqa: E402

DEFAULT_FAMILIES = ("llama3", "unigram_metaspace", "sentencepiece_bpe", "stripping_markers")


def cli_report(trace: Path, tokenizer: Path, full_encode: bool, *extra: str) -> bytes:
    """The CLI's JSON report of ``trace`` (stdout bytes)."""
    cmd = [sys.executable, "-m", "templates_audit", "--tokenizer", str(tokenizer),
           "--format", "json", "--no-progress", *extra, str(trace)]
    if full_encode:
        cmd.insert(-1, "--full-encode")
    out = subprocess.run(cmd, capture_output=True, cwd=ROOT, check=False)
    if out.returncode not in (0, 1):  # 1: --fail-under, not used here
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.decode()}")
    return out.stdout


def compare(name: str, a: bytes, b: bytes, secs: float) -> bool:
    same = a == b
    ha, hb = (hashlib.sha256(x).hexdigest()[:16] for x in (a, b))
    print(f"{name}: {'identical' if same else 'DIFFERENT'} ({len(a):,} bytes; incremental "
          f"{ha}, full encode {hb}; {secs:.0f} s)", flush=True)
    return same


def check_trace(trace: Path, tokenizer: Path, name: str, *extra: str) -> bool:
    start = time.monotonic()
    inc = cli_report(trace, tokenizer, False, *extra)
    full = cli_report(trace, tokenizer, True, *extra)
    return compare(name, inc, full, time.monotonic() - start)


def check_shared(data: Path, requests: int, tokenizer: Path, name: str, tmp: Path) -> bool:
    from eval_auditor import eval_spans

    from templates_audit.tokenize import load_tokenizer

    start = time.monotonic()
    out = []
    for incremental in (True, False):
        path = tmp / f"report-{incremental}.json"
        eval_spans(data, requests, 7, load_tokenizer(str(tokenizer), incremental=incremental),
                   path)
        out.append(path.read_bytes())
    return compare(name, out[0], out[1], time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    from eval_auditor import _default_data

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=5000, help="requests of the bench trace")
    p.add_argument("--templates", type=int, default=30)
    p.add_argument("--data", type=Path, default=_default_data())
    p.add_argument("--eval-requests", type=int, default=40,
                   help="requests per dynamic prompt of the ../shared evaluation")
    p.add_argument("--families", nargs="*", default=list(DEFAULT_FAMILIES),
                   help="tokenizer families also run on the ../shared evaluation")
    args = p.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bpe = tmp / "bench" / "tokenizer.json"
        bpe.parent.mkdir()
        train_tokenizer(bpe, args.templates)
        for user in ("numbers", "words"):
            trace = tmp / f"bench-{user}.jsonl"
            with trace.open("wb") as fh:
                fh.writelines(lines(args.requests, args.templates, user=user))
            ok &= check_trace(trace, bpe, f"bench trace, {args.requests:,} requests, {user} "
                                          "user turns, bench BPE")
        trace = tmp / "bench-numbers.jsonl"
        ok &= check_trace(trace, bpe, "bench trace, numbers, --cache-blocks 2000 --block-size 32",
                          "--cache-blocks", "2000", "--block-size", "32")
        if not (args.data / "system_prompts" / "manifest.jsonl").exists():
            print(f"../shared evaluation: skipped (no data under {args.data})")
            return 0 if ok else 1
        from tests.templates_audit.tokenizer_families import FAMILIES

        toks = [("bench BPE", bpe)]
        for fam in args.families:
            path = tmp / fam / "tokenizer.json"
            path.parent.mkdir()
            path.write_text(FAMILIES[fam](), encoding="utf-8")
            toks.append((fam, path))
        for name, path in toks:
            ok &= check_shared(args.data, args.eval_requests, path,
                               f"../shared evaluation ({args.eval_requests} requests per dynamic "
                               f"prompt), {name}", tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
