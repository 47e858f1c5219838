#!/usr/bin/env python3
"""Values of any shape injected anywhere: the issue-34 property as a before/after count.

Each case injects a random-shaped value (1-4 odd words such as ``#AB12417 Ødegård93 v2.3.1600``)
at a random word of a static 12-rule system prompt, a new value in each of 24 requests, and
counts the cases audited as one template with exactly one finding where the value starts.
``PYTHONPATH=/path/to/other/tree python scripts/eval_injected.py`` audits with another tree.

Usage: ``python scripts/eval_injected.py [--cases 40]``.
"""

from __future__ import annotations

import argparse
import json
import random

from templates_audit.analysis import analyze
from templates_audit.traces import Record

BODY = " ".join(f"Rule {i}: answer in full sentences, cite the policy and never guess."
                for i in range(12))
WORDS = ["Zorblat", "quux-77", "#AB12", "9f3c", "Kestrel Ridge", "éclair", "0xdeadbeef",
         "Ødegård", "v2.3.1", "ticket", "α-beta", "42", "MAY", "(draft)"]
HEADER = "<|im_start|>system\n"  # the default (ChatML) rendering before the system message


def case(seed: int, requests: int = 24) -> bool:
    rng = random.Random(seed)
    words = BODY.split(" ")
    pos = rng.randrange(0, len(words) - 8)
    records = []
    for i in range(requests):
        value = " ".join(rng.choice(WORDS) + str(rng.randrange(1000))
                         for _ in range(rng.randint(1, 4)))
        system = " ".join([*words[:pos], value, *words[pos:]])
        records.append(Record("t", i + 1, model="m", messages=[
            {"role": "system", "content": system}, {"role": "user", "content": f"q {i}?"}]))
    report = analyze(records)
    start = len(HEADER + " ".join(words[:pos]))
    at = [f for f in report.findings if start <= f.char_start <= start + 1]
    return report.summary.templates == 1 and len(at) == 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=40)
    args = p.parse_args(argv)
    ok = sum(case(seed) for seed in range(args.cases))
    print(json.dumps({"cases": args.cases, "one_template_and_finding_at_position": ok}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
