"""Where volatile values can be: small windows of the text around "seeds".

Python's `re` tries a character-class-prefixed pattern at ~30 ns per character, so forty
patterns over a 32 KB prompt cost tens of milliseconds. But every date, time, id, epoch and
validated key contains an ASCII digit, and prompts are mostly prose. So:

1. classify every character with one `bytes.translate` (latin-1 encoding, anything outside it
   becomes `?`): digit `1`, `A/a/P/p` `p`, `M/m` `m`, `V/v` `v`, other ASCII letters `a`,
   `-`/`_` `-`, `:` `:`, `.` `.`, `/` `/`, `?`/non-latin-1 `?`, everything else a space;
2. seeds are found with one regex over those class bytes whose first byte is the literal `1`
   (so `re` jumps from digit to digit) and with `bytes.find` for long tokens:
   - a digit run of 4+ (years, epochs, ids), one touching `:` (times) or a non-latin-1
     character (`2024年8月21日`), or followed by `AM`/`PM` (`7 PM`);
   - three two-digit runs joined by `/` or `.` (`03/04/25`, a date with a two-digit year);
   - a token of 14+ letters/digits/`-`/`_` holding a digit (hex ids, UUIDs, keys);
   - for `scan` (`dotted=True`) also dotted numbers (`3.11`) and `v2`;
   - `extra` literal needles (`eyJ`, the start of every JWT).
   A lone `3`, `10`, `1.` or `GPT-4` (list numbers, counts, names) seeds nothing;
3. around each seed take a window from 32 characters before to 64 after, widened to the
   nearest space or newline (at most 256 more) so no token is cut; overlapping windows merge.

A value is found in a window iff it is found in the whole text, because every value holds a
seed (a short number only occurs next to a 4-digit year or a `:` within the margins: `24 April
2025`, `7 PM on March 1, 2026`), left-boundary checks and validators read the whole text, and
no value reaches more than 64 characters past its last digit (the longest suffix is a timezone
such as ` GMT+0000 (Coordinated Universal Time)`). Tests check this equivalence.

Cost: O(n) in C (encode, translate, literal search) plus O(seeds) Python steps; a short text
whose shape (ASCII digits alike) was seen before costs one translate and one lookup.
"""

from __future__ import annotations

import re

Window = tuple[int, int, int]  # start, end, longest digit run inside (a gate for detectors)

_LEFT, _RIGHT, _SNAP, _TOKEN = 32, 64, 256, 14
# a long-token seed: its digit runs are not measured; a window holding one reports this run
LONG_TOKEN_RUN = _UNKNOWN_RUN = 1 << 30


def _class_table() -> bytes:
    table = bytearray(b" " * 256)
    for byte in range(256):
        c = chr(byte)
        if c.isdigit() and c.isascii():
            table[byte] = ord("1")
        elif c in "AaPp":
            table[byte] = ord("p")
        elif c in "Mm":
            table[byte] = ord("m")
        elif c in "Vv":
            table[byte] = ord("v")
        elif c.isascii() and c.isalpha():
            table[byte] = ord("a")
        elif c in "-_":
            table[byte] = ord("-")
        elif c in ":.?/":
            table[byte] = byte
    return bytes(table)


_CLASSES = _class_table()
_WORDISH = bytes(0x77 if c in b"1pmva-" else 0x20 for c in _CLASSES)  # token chars -> "w"
_DIGIT_SEEDS = re.compile(rb"1(?:(?<=[:?]1)1*|1*(?=[:?]| ?p\.?m)|111+)")
_DOTTED_SEEDS = re.compile(rb"1(?:(?<=[:?]1)1*|1*(?=[:?]| ?p\.?m|\.1)|111+|(?<=[v.]1)1*)")
_SHORT_DATE_SEEDS = re.compile(rb"11(?:/11/|\.11\.)11")  # `03/04/25`: no run of 4 digits


def _snap_left(text: str, i: int) -> int:
    if i <= 0:
        return 0
    lo = max(0, i - _SNAP)
    k = max(text.rfind(" ", lo, i), text.rfind("\n", lo, i))
    return k + 1 if k >= 0 else lo


def _snap_right(text: str, j: int) -> int:
    n = len(text)
    if j >= n:
        return n
    hi = min(n, j + _SNAP)
    ends = [k for k in (text.find(" ", j, hi), text.find("\n", j, hi)) if k >= 0]
    return min(ends) if ends else hi


def _long_tokens(classes: bytes) -> list[tuple[int, int, int]]:
    words = classes.translate(_WORDISH)
    needle = b"w" * _TOKEN
    out = []
    k = words.find(needle)
    while k >= 0:
        start = words.rfind(b" ", 0, k) + 1
        end = words.find(b" ", k)
        end = len(words) if end < 0 else end
        if classes.find(b"1", start, end) >= 0:
            out.append((start, end, _UNKNOWN_RUN))
        k = words.find(needle, end)
    return out


# Windows depend on a text only through its characters' classes (all digits alike) and where
# its spaces and newlines are, so texts that differ only in their ASCII digits (a timestamp
# line, a date line) have the same windows: short texts are memoised by that shape.
_SHAPE = bytes.maketrans(b"123456789", b"000000000")
_SHAPED_MAX_CHARS = 512
_SHAPED_MAX = 4096
_shaped: dict[tuple[bytes, bool], list[Window]] = {}


def windows(text: str, *, dotted: bool, extra: tuple[str, ...] = ()) -> list[Window]:
    """Sorted, disjoint windows around the seeds of `text` (do not mutate the result)."""
    if extra or len(text) > _SHAPED_MAX_CHARS:
        return _windows(text, dotted, extra)
    key = (text.encode("utf-8", "surrogatepass").translate(_SHAPE), dotted)
    out = _shaped.get(key)
    if out is None:
        if len(_shaped) >= _SHAPED_MAX:
            _shaped.clear()
        out = _shaped[key] = _windows(text, dotted, extra)
    return out


def _windows(text: str, dotted: bool, extra: tuple[str, ...]) -> list[Window]:
    classes = text.encode("latin-1", "replace").translate(_CLASSES)
    pattern = _DOTTED_SEEDS if dotted else _DIGIT_SEEDS
    seeds = [(a, b, b - a) for a, b in map(re.Match.span, pattern.finditer(classes))]
    seeds += [(a, b, 2) for a, b in map(re.Match.span, _SHORT_DATE_SEEDS.finditer(classes))]
    seeds += _long_tokens(classes)
    for needle in extra:
        k = text.find(needle)
        while k >= 0:
            seeds.append((k, k + len(needle), 0))
            k = text.find(needle, k + 1)
    seeds.sort()
    out: list[Window] = []
    for a, b, run in seeds:
        lo, hi = _snap_left(text, a - _LEFT), _snap_right(text, b + _RIGHT)
        if out and lo <= out[-1][1]:
            prev = out[-1]
            out[-1] = (prev[0], max(prev[1], hi), max(prev[2], run))
        else:
            out.append((lo, hi, run))
    return out
