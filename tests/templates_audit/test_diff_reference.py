"""``findings.changed_range`` (line comparison) against the character-level computation it
replaces on the hot path, ``changed_lines(ref, diff_bounds(ref, req))``, on random edits."""

from __future__ import annotations

import random

from templates_audit.findings import (
    changed_lines,
    changed_range,
    common_prefix,
    common_suffix,
    diff_spans,
)


def diff_bounds(ref: str, req: str) -> tuple[int, int]:
    """The reference: (common prefix, common suffix no longer than what the prefix leaves)."""
    p = common_prefix(ref, req)
    return p, common_suffix(ref, req, min(len(ref), len(req)) - p)

PIECES = ["a", "b", "ab", "ba", "", " ", "\n", "2024-05-20", "12:34:56Z", "Alice", "x\n", "\nx"]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(n))


def _edit(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randrange(0, 4)):
        op = rng.randrange(4)
        i = rng.randrange(len(chars) + 1)
        if op == 0:
            chars[i:i] = rng.choice(PIECES)
        elif op == 1 and i < len(chars):
            del chars[i:i + rng.randrange(1, 4)]
        elif op == 2 and i < len(chars) and chars[i] != "\n":
            chars[i] = rng.choice("abxyz019 ")
        else:  # keep the line structure: change a value inside a line
            lines = "".join(chars).split("\n")
            k = rng.randrange(len(lines))
            lines[k] = lines[k][: rng.randrange(len(lines[k]) + 1)] + rng.choice(["7", "Bob", "", "ab"])
            chars = list("\n".join(lines))
    return "".join(chars)


def test_changed_range_equals_the_character_level_lines() -> None:
    rng = random.Random(4)
    for _ in range(20000):
        ref = _text(rng, rng.randrange(0, 12))
        req = _edit(rng, ref) if rng.random() < 0.8 else _text(rng, rng.randrange(0, 12))
        expected = changed_lines(ref, diff_bounds(ref, req))
        assert changed_range(ref, req) == expected, (ref, req)
        assert diff_spans(ref, req, expected) == diff_spans(ref, req), (ref, req)


def test_common_prefix_and_suffix_equal_a_character_loop() -> None:
    rng = random.Random(9)
    for _ in range(3000):
        shared = "".join(rng.choice("ab\n") for _ in range(rng.randrange(0, 600)))
        a = shared + "".join(rng.choice("abc") for _ in range(rng.randrange(0, 5)))
        b = shared + "".join(rng.choice("abd") for _ in range(rng.randrange(0, 5)))
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n
        m = 0
        while m < min(len(a), len(b)) and a[-1 - m] == b[-1 - m]:
            m += 1
        assert common_suffix(a[::-1], b[::-1]) == n
        assert common_suffix(a, b) == m
