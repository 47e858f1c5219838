#!/usr/bin/env python3
"""Check the incremental tokenizer against full encodes on the real prompts of ../shared.

Audits the evaluation trace of ``scripts/eval_auditor.py`` (every ``system_prompts`` prompt,
instantiated with same-shape values; ``--requests`` per dynamic prompt) with each tokenizer —
the families the unit tests train (``tests/templates_audit/tokenizer_families.py``) and any
``--tokenizer`` files — comparing **every** splice with the library's full encode (ids, offsets
and restart points). An encoder that disagrees once turns splicing off and says why; this
script then reports the family and exits 1. The longer property tests:
``PREFIX_ROUTER_FUZZ=long pytest tests/templates_audit/test_incremental.py``.

Usage: ``python scripts/check_incremental.py [--requests 10] [--tokenizer PATH ...]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from eval_auditor import _default_data, eval_spans  # noqa: E402

from templates_audit.tokenize import HFTokenizer  # noqa: E402
from tests.templates_audit.tokenizer_families import FAMILIES  # noqa: E402


def check(name: str, path: str, data: Path, requests: int) -> bool:
    tok = HFTokenizer(path)
    inc = tok.incremental
    assert inc is not None
    inc.checks = 1 << 62  # every splice
    start = time.process_time()
    eval_spans(data, requests, 7, tok)
    st = inc.stats
    print(f"{name:26s} level {inc.rules.level} ({inc.rules.family}): {st['spliced']:5,} splices "
          f"checked, {st['reused_tokens'] / max(st['reused_tokens'] + st['encoded_tokens'], 1):.0%}"
          f" of tokens reused, {time.process_time() - start:5.1f} CPU s"
          + (f" -- DISAGREED: {inc.disabled}" if inc.disabled else ""), flush=True)
    return not inc.disabled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=_default_data())
    p.add_argument("--requests", type=int, default=10, help="requests per dynamic prompt")
    p.add_argument("--tokenizer", action="append", default=[], help="also this tokenizer.json")
    args = p.parse_args(argv)
    if not (args.data / "system_prompts" / "manifest.jsonl").exists():
        print(f"no evaluation data under {args.data}", file=sys.stderr)
        return 2
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in FAMILIES.items():
            path = Path(tmp) / f"{name}.json"
            path.write_text(build(), encoding="utf-8")
            ok &= check(name, str(path), args.data, args.requests)
    for path in args.tokenizer:
        ok &= check(Path(path).parent.name or path, path, args.data, args.requests)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
