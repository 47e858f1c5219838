"""Varying spans between a template's reference prompt and one request: where, what, which kind.

Algorithm (per request whose static part differs from the reference's):

1. Split both texts into lines. With equal line counts, lines are compared by position; otherwise
   ``difflib`` aligns them (``autojunk`` off) and unequal replace/insert/delete runs become one
   multi-line span each.
2. Runs of differing lines with at most one equal line between them form a cluster. A cluster of
   two or more lines whose lines are the same multiset on both sides is a ``reordered_block``
   (shuffled few-shot examples, tools in another order); so is a cluster together with the next
   few when only their union is (two lines swapped across lines that stayed in place), and one
   that is the same multiset once detected values are masked: then the values that differ
   inside it (a commit id in one of the shuffled tools) are ``inner`` spans of their own.
3. Other differing line pairs are diffed at word level; each differing run is widened to whole
   words and to any detector match (``scan``) it touches, runs separated only by punctuation or
   space are merged (not two detected values parted by punctuation: ``<uuid>, <date>``), and
   each span's kind comes from ``classify(before, value, after)``. A pair
   that differs only in whitespace is one ``whitespace`` span.
4. Rewritten text is one span, not a confetti of word diffs: a line pair whose word diff has
   :data:`PROSE_RUNS` or more runs of plain words (no detected value, and not shaped like a
   name or an id: ``Dagný van der Berg · Employee no. E40522 · Region: EMEA`` is three values), or such runs of
   :data:`PROSE_WORDS` words or more in all, is one span over its changed middle; a cluster with two
   or more such lines (retrieved documents, a per-user paragraph) is one multi-line span.
   Replace/insert/delete runs that only blank lines separate are one run (paragraphs).

Invariant: ``ref[s.ref_start:s.ref_end]`` and ``req[s.start:s.end]`` are the two values of span
``s``; spans are sorted and non-overlapping, except ``inner`` spans, which lie inside the
reordered block listed before them. Cost: O(lines) when line counts agree, plus
O(words^2) per differing line of fewer than 200 words (near-linear beyond: difflib's autojunk);
difflib on lines only when lines were inserted/removed.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import re
from collections.abc import Sequence
from typing import NamedTuple

from templates_audit.detectors import Kind, Match, classify, scan
from templates_audit.detectors.shapes import id_shaped, name_shaped

__all__ = ["Span", "changed_lines", "changed_range", "common_prefix", "common_suffix",
           "diff_spans", "line_matches", "line_spans", "mask_line"]

_WORDS = re.compile(r"\w+|[^\w\s]")  # words and punctuation; spaces stay between them
_JOINERS = frozenset("-_:.@+#'")  # characters that glue one value together ("2024-05-20", "a.b@c")
_SPACE = re.compile(r"\s")  # matches exactly the characters for which str.isspace() is true
PROSE_RUNS = 3  # word-diff runs of plain words that make a line pair "rewritten"
PROSE_WORDS = 8  # ... or that many plain words changed in all (a value is a few words)
_PLAIN = re.compile(r"\w+")
MAX_DIFF_WORDS = 4000  # longer changed middles are not word-diffed


class Span(NamedTuple):
    """One varying span: ``ref[ref_start:ref_end]`` in the reference, ``req[start:end]`` in the
    request (a named tuple: several are built per diffed request)."""

    ref_start: int
    ref_end: int
    start: int
    end: int
    kind: str
    multi_line: bool = False  # a block of text, not a value: lines inserted/removed/rewritten
    inner: bool = False  # a value inside a reordered block: its own slot, never merged with it


def _line_starts(lines: list[str]) -> list[int]:
    return [0, *itertools.accumulate(len(line) + 1 for line in lines[:-1])]


def diff_spans(ref: str, req: str, lines: tuple[int, int] | None = None) -> list[Span]:
    """Spans where ``req`` differs from ``ref`` (see the module docstring). ``lines``: the
    ``(lo, hi)`` of :func:`changed_range` when the caller already has them."""
    if ref == req:
        return []
    # Only the lines between the first and the last differing character need a diff.
    lo, hi = lines if lines is not None else changed_range(ref, req)
    tail = len(ref) - hi
    return [Span(sp.ref_start + lo, sp.ref_end + lo, sp.start + lo, sp.end + lo, sp.kind,
                 sp.multi_line, sp.inner)
            for sp in _diff_lines(ref[lo:hi], req[lo:len(req) - tail])]


def changed_lines(ref: str, bounds: tuple[int, int]) -> tuple[int, int]:
    """``(lo, hi)``: ``ref[lo:hi]`` is the whole lines holding every difference located by
    ``bounds`` = (common prefix, common suffix no longer than what the prefix leaves). ``lo``
    starts the first differing line and ``hi`` is the newline ending the last one (or
    ``len(ref)``); both texts agree on ``[:lo]`` and on the last ``len(ref) - hi`` characters."""
    p, s = bounds
    hi = ref.find("\n", len(ref) - s)
    return ref.rfind("\n", 0, p) + 1, len(ref) if hi < 0 else hi


def changed_range(ref: str, req: str) -> tuple[int, int]:
    """`changed_lines` of the texts' character-level common prefix and suffix, without the long
    common-suffix search when every difference lies in one line (the common case: a value
    changed): after the common prefix ``p``, if both texts continue equally from the newline
    that ends ``p``'s line, the common suffix starts inside that line, so ``hi`` is that
    newline. A test checks this against the character-level computation on random edits."""
    p = common_prefix(ref, req)
    lo = ref.rfind("\n", 0, p) + 1
    end_a, end_b = ref.find("\n", p), req.find("\n", p)
    if end_a < 0 and end_b < 0:  # the differences are in the last line
        return lo, len(ref)
    if 0 <= end_a and 0 <= end_b and len(ref) - end_a == len(req) - end_b and ref.endswith(req[end_b:]):
        return lo, end_a
    return changed_lines(ref, (p, common_suffix(ref, req, min(len(ref), len(req)) - p)))


def _diff_lines(ref: str, req: str) -> list[Span]:
    a = ref.split("\n")
    b = req.split("\n")
    a0 = _line_starts(a)
    b0 = _line_starts(b)
    out: list[Span] = []
    if len(a) == len(b):
        _aligned(ref, req, a, b, a0, b0, 0, 0, len(a), out)
        return out
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for i1, i2, j1, j2 in _runs(sm.get_opcodes(), a):
        if i2 - i1 == j2 - j1:
            _aligned(ref, req, a, b, a0, b0, i1, j1, i2 - i1, out)
            continue
        rs = a0[i1] if i1 < len(a) else len(ref)
        re_ = (a0[i2 - 1] + len(a[i2 - 1])) if i2 > i1 else rs
        qs = b0[j1] if j1 < len(b) else len(req)
        qe = (b0[j2 - 1] + len(b[j2 - 1])) if j2 > j1 else qs
        out.append(Span(rs, re_, qs, qe, _side_kind(ref, req, rs, re_, qs, qe), multi_line=True))
    return out


def _runs(opcodes: Sequence[tuple[str, int, int, int, int]], a: list[str]
          ) -> list[tuple[int, int, int, int]]:
    """The non-equal opcodes' ranges, with runs that only blank lines separate joined."""
    out: list[list[int]] = []
    gap_blank = False
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            gap_blank = all(not line.strip() for line in a[i1:i2])
            continue
        if out and gap_blank:
            out[-1][1], out[-1][3] = i2, j2
        else:
            out.append([i1, i2, j1, j2])
        gap_blank = False
    return [(r[0], r[1], r[2], r[3]) for r in out]


def _block_kind(before: str, value: str, after: str) -> str:
    # classify() already recognises a value that is a credential; a credential *inside* an
    # injected multi-line block needs a scan of the block.
    if "\n" in value and any(m.kind is Kind.SECRET for m in scan(value)):
        return Kind.SECRET.value
    return str(classify(before[-96:], value, after[:96]))


def _side_kind(ref: str, req: str, rs: int, re_: int, qs: int, qe: int) -> str:
    """The kind of a block that is ``ref[rs:re_]`` / ``req[qs:qe]``: judged on the request's
    text, or on the reference's when the request removed it (96 characters of context)."""
    text, s, e = (req, qs, qe) if qe > qs else (ref, rs, re_)
    return _block_kind(text[max(0, s - 96):s], text[s:e], text[e:e + 96])


MAX_REORDER_CLUSTERS = 8  # how far a swap of distant lines is looked for


def _permuted_through(a: list[str], b: list[str], i: int, j: int, clusters: list[list[int]],
                      c: int, masked: bool = False) -> int | None:
    """The first cluster ``d`` (``c`` itself, or one of the next :data:`MAX_REORDER_CLUSTERS`)
    such that lines ``clusters[c][0]..clusters[d][-1]`` are the same multiset on both sides, or
    None: shuffled lines, including two swapped across lines that stayed in place. ``masked``:
    lines compared with their detected values masked (:func:`mask_line`), and at least one
    must have moved (values that changed in place are no reordering)."""
    delta: dict[str, int] = {}
    unbalanced = 0  # lines whose count differs between the two sides
    moved = not masked
    for d in range(c, min(len(clusters), c + MAX_REORDER_CLUSTERS)):
        start = clusters[c][0] if d == c else clusters[d - 1][-1] + 1
        for k in range(start, clusters[d][-1] + 1):
            x, y = a[i + k], b[j + k]
            if masked:
                x, y = mask_line(x), mask_line(y)
                moved |= x != y
            if x != y:
                for line, step in ((x, 1), (y, -1)):
                    was = delta.get(line, 0)
                    delta[line] = was + step
                    unbalanced += (was == 0) - (was + step == 0)
        if not unbalanced and moved:
            return d
    return None


def _inner_values(a: list[str], b: list[str], a0: list[int], b0: list[int], i: int, j: int,
                  lo: int, hi: int, out: list[Span]) -> None:
    """The values that differ inside a block reordered with its values masked: each request
    line is paired with the first unpaired reference line of the block masked alike, and their
    word diff gives ``inner`` spans (a commit id in one of shuffled tool descriptions)."""
    free: dict[str, list[int]] = {}
    for k in range(lo, hi):
        free.setdefault(mask_line(a[i + k]), []).append(k)
    for k in range(lo, hi):
        line = b[j + k]
        same = free.get(mask_line(line))
        if not same:
            continue
        r = same.pop(0)
        if a[i + r] != line:
            ra, qb = a0[i + r], b0[j + k]
            out.extend(Span(ra + sp.ref_start, ra + sp.ref_end, qb + sp.start, qb + sp.end,
                            sp.kind, False, True)
                       for sp in line_spans(a[i + r], line) if not sp.multi_line)


def _aligned(ref: str, req: str, a: list[str], b: list[str], a0: list[int], b0: list[int],
             i: int, j: int, n: int, out: list[Span]) -> None:
    diff = [k for k in range(n) if a[i + k] != b[j + k]]
    clusters: list[list[int]] = []
    for k in diff:
        if clusters and k - clusters[-1][-1] <= 2:
            clusters[-1].append(k)
        else:
            clusters.append([k])
    c = 0
    while c < len(clusters):
        cl = clusters[c]
        # (one changed line with no other cluster after it is never a reordering: the usual case)
        several = len(cl) >= 2 or c + 1 < len(clusters)
        last = _permuted_through(a, b, i, j, clusters, c) if several else None
        masked = False
        if last is None and several:
            last = _permuted_through(a, b, i, j, clusters, c, masked=True)
            masked = last is not None
        if last is not None:
            lo, hi = cl[0], clusters[last][-1] + 1
            out.append(Span(a0[i + lo], a0[i + hi - 1] + len(a[i + hi - 1]),
                            b0[j + lo], b0[j + hi - 1] + len(b[j + hi - 1]),
                            Kind.REORDERED_BLOCK.value, multi_line=True))
            if masked:
                _inner_values(a, b, a0, b0, i, j, lo, hi, out)
            c = last + 1
            continue
        c += 1
        spans = []
        for k in cl:
            ra, qb = a0[i + k], b0[j + k]
            for s in line_spans(a[i + k], b[j + k]):
                spans.append(Span(ra + s.ref_start, ra + s.ref_end, qb + s.start, qb + s.end,
                                  s.kind, s.multi_line))
        if sum(s.multi_line for s in spans) >= 2:  # rewritten paragraphs: one block
            rs, re_ = spans[0].ref_start, spans[-1].ref_end
            qs, qe = spans[0].start, spans[-1].end
            out.append(Span(rs, re_, qs, qe, _side_kind(ref, req, rs, re_, qs, qe),
                            multi_line=True))
        else:
            out.extend(spans)


@functools.lru_cache(maxsize=1 << 16)
def line_matches(line: str) -> tuple[Match, ...]:
    """``scan(line)``, cached: a line is scanned once whether it is masked, widened or classified."""
    return tuple(scan(line))


@functools.lru_cache(maxsize=1 << 16)
def mask_line(line: str) -> str:
    """``line`` with every detector match replaced by ``\\x00kind\\x00``."""
    matches = line_matches(line)
    if not matches:
        return line
    parts = []
    pos = 0
    for m in matches:
        parts.append(line[pos:m.start])
        parts.append(f"\x00{m.kind.value}\x00")
        pos = m.end
    parts.append(line[pos:])
    return "".join(parts)


def _widen(text: str, s: int, e: int) -> tuple[int, int]:
    """Grow [s, e) to whole words/values, then to every detector match it touches."""
    while s > 0 and (text[s - 1].isalnum() or text[s - 1] in _JOINERS):
        s -= 1
    while e < len(text) and (text[e].isalnum() or text[e] in _JOINERS):
        e += 1
    changed = True
    while changed:
        changed = False
        for m in line_matches(text):
            if m.start < e and m.end > s and (m.start < s or m.end > e):
                s, e = min(s, m.start), max(e, m.end)
                changed = True
    # A value rarely ends in a joiner: "Paris." -> "Paris".
    while e > s and text[e - 1] in _JOINERS and text[e - 1] not in "_#":
        e -= 1
    while s < e and text[s] in _JOINERS and text[s] not in "_#":
        s += 1
    return s, e


@functools.lru_cache(maxsize=1 << 14)
def line_spans(a: str, b: str) -> tuple[Span, ...]:
    """Spans of one differing line pair, offsets relative to the lines. Cached: per-day values
    repeat, so the same pair comes back many times."""
    if a.split() == b.split():
        p = common_prefix(a, b)
        s = common_suffix(a, b, min(len(a), len(b)) - p)
        return (Span(p, len(a) - s, p, len(b) - s, Kind.WHITESPACE.value),)
    # Word-diff only the middle: trim the common prefix/suffix back to word boundaries.
    p = common_prefix(a, b)
    while p > 0 and (a[p - 1].isalnum() or a[p - 1] in _JOINERS):
        p -= 1
    s = common_suffix(a, b, min(len(a), len(b)) - p)
    while s > 0 and (a[len(a) - s].isalnum() or a[len(a) - s] in _JOINERS):
        s -= 1
    end_a, end_b = len(a) - s, len(b) - s
    runs: list[list[int]] = []
    if _SPACE.search(a, p, end_a) is None and _SPACE.search(b, p, end_b) is None:
        # One word-like value changed (the common case): no word diff needed.
        runs.append([*_widen(a, p, end_a), *_widen(b, p, end_b)])
        return _spans(a, b, runs)
    ta = [m.span() for m in _WORDS.finditer(a, p, end_a)]
    tb = [m.span() for m in _WORDS.finditer(b, p, end_b)]
    if max(len(ta), len(tb)) > MAX_DIFF_WORDS:
        return _rewritten(a, b, [[*_widen(a, p, end_a), *_widen(b, p, end_b)]])
    # autojunk: from 200 words on, frequent words do not anchor matches (they still extend
    # them), which keeps long lines near-linear; shorter lines get the exact diff.
    sm = difflib.SequenceMatcher(None, [a[x:y] for x, y in ta], [b[x:y] for x, y in tb])
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        ra = (ta[i1][0], ta[i2 - 1][1]) if i2 > i1 else ((ta[i1][0],) * 2 if i1 < len(ta) else (end_a, end_a))
        rb = (tb[j1][0], tb[j2 - 1][1]) if j2 > j1 else ((tb[j1][0],) * 2 if j1 < len(tb) else (end_b, end_b))
        sa, ea = _widen(a, *ra)
        sb, eb = _widen(b, *rb)
        runs.append([sa, ea, sb, eb])
    spans = _spans(a, b, runs)
    prose = [sp for sp in spans if sp.kind == _OTHER and not _shaped(b[sp.start:sp.end] or a[sp.ref_start:sp.ref_end])]
    if len(prose) >= PROSE_RUNS or max(
            sum(len(_PLAIN.findall(a, sp.ref_start, sp.ref_end)) for sp in prose),
            sum(len(_PLAIN.findall(b, sp.start, sp.end)) for sp in prose)) >= PROSE_WORDS:
        return _rewritten(a, b, runs)
    return spans


_OTHER = Kind.OTHER.value


def _shaped(value: str) -> bool:
    """A run no detector names that is still a value, not prose: a name or an id by its shape."""
    return name_shaped(value) or id_shaped(value)


def _rewritten(a: str, b: str, runs: list[list[int]]) -> tuple[Span, ...]:
    """One span over every run: the line was rewritten, not a value changed."""
    sa, ea = min(r[0] for r in runs), max(r[1] for r in runs)
    sb, eb = min(r[2] for r in runs), max(r[3] for r in runs)
    return (Span(sa, ea, sb, eb, _side_kind(a, b, sa, ea, sb, eb), multi_line=True),)


def _two_values(text: str, s0: int, e0: int, s1: int, e1: int) -> bool:
    """Whether ``text[s0:e0]`` and ``text[s1:e1]`` are each exactly one detected value and
    punctuation, not only space, parts them (``<uuid>, 2025-03-03``): two values, two spans."""
    if not any(not c.isspace() for c in text[e0:s1]):
        return False
    bounds = {(m.start, m.end) for m in line_matches(text)}
    return (s0, e0) in bounds and (s1, e1) in bounds


def _spans(a: str, b: str, runs: list[list[int]]) -> tuple[Span, ...]:
    """Merge widened runs separated by punctuation/space only (unless they are two detected
    values parted by punctuation), and give each its kind."""
    merged: list[list[int]] = []
    for r in sorted(runs, key=lambda r: (r[2], r[0])):
        if merged:
            last = merged[-1]
            gap = b[last[3]:r[2]] if r[2] > last[3] else ""
            if r[2] <= last[3] or r[0] <= last[1] or (
                    not any(c.isalnum() for c in gap)
                    and not _two_values(b, last[2], last[3], r[2], r[3])):
                last[0], last[1] = min(last[0], r[0]), max(last[1], r[1])
                last[2], last[3] = min(last[2], r[2]), max(last[3], r[3])
                continue
        merged.append(r)
    out = []
    for sa, ea, sb, eb in merged:
        text, vs, ve = (b, sb, eb) if eb > sb else (a, sa, ea)
        # A span that is exactly one detected value takes its kind; otherwise classify().
        exact = [m.kind.value for m in line_matches(text) if (m.start, m.end) == (vs, ve)]
        kind = exact[0] if exact else _block_kind(text[:vs], text[vs:ve], text[ve:])
        out.append(Span(sa, ea, sb, eb, kind))
    return tuple(out)


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix (C-speed slice compares: galloping from the start — texts
    usually differ near the top — then binary search)."""
    lo, hi = 0, min(len(a), len(b))
    step = 64
    while step < hi:
        if a[:step] != b[:step]:
            hi = step - 1
            break
        lo = step
        step *= 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: str, b: str, limit: int | None = None) -> int:
    """Length of the common suffix, at most ``limit``."""
    lo, hi = 0, min(len(a), len(b), len(a) if limit is None else limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.endswith(b[len(b) - mid:]):  # equal last mid characters, one copy instead of two
            lo = mid
        else:
            hi = mid - 1
    return lo
