"""Template discovery the way vLLM shares blocks: a radix tree over prompts and re-convergence.

vLLM does not group prompts: it reuses a block when every token before it is the same. So the
auditor finds templates from the same structure. Prompts are split into *pieces*
(:func:`pieces`: a run of word characters or of punctuation with the whitespace before it -
the pre-tokenisation every BPE tokenizer applies, so a piece boundary is a token boundary for
the default tokenizer and nearly so for any other) and handled as sequences of piece hashes.

**The tree** (:class:`PrefixTree`) is a radix tree over those sequences with a request count
per node. The deepest node a new prompt reaches is where it diverges from every prompt seen
so far; the template recorded on that node (and on the deepest node of the tree of reversed
prompts, for a prompt whose volatile value comes first) is the candidate it is aligned with.
Memory: at most ``max_paths`` distinct paths (leaves); past the bound a prompt only walks and
counts the nodes that exist (counts stay exact for every prefix that is kept; the distinct
suffixes past the bound are not stored: a sample of the first ``max_paths``).

**Re-convergence** (:func:`align`): from a divergence point the two continuations are scanned
for the nearest place where they agree again on :data:`ANCHOR` pieces (within
:data:`MAX_GAP` pieces on each side); the differing run before it is a *gap* - a volatile
value, whatever its shape - and the scan resumes after the anchor. A continuation that never
re-converges is a *tail*: the request's own content, not a finding.

**A template** is the set of requests that differ only in gaps (:func:`same_template`): short
gaps (values: a name, an id, a timestamp) always; a long gap (a block of examples, memories,
retrieved text) when the text it re-converges on is at least as long as the gap and neither side
reads as prose (:func:`prose`: another prompt's sentence), or both sides are blocks of the same
line structure (:func:`same_structure`); a differing tail when it is
short or the same kind of block. Two families that share a first paragraph diverge into long
continuations that never re-converge (or re-converge only on a closing line much shorter than
what differs), so they stay two templates.

Cost: :func:`pieces` is one regex pass; tree walks compare piece-hash slices (C speed) edge by
edge, O(depth); :func:`align` is O(gap length) dictionary operations per gap (scanning outwards from the divergence). It runs
only for static parts not seen before and not equal to a known template once detector values
are masked.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

__all__ = [
    "ANCHOR",
    "MAX_GAP",
    "MAX_PATHS",
    "Alignment",
    "PrefixTree",
    "align",
    "pieces",
    "prose",
    "same_structure",
    "same_template",
]

ANCHOR = 4  # pieces two continuations must agree on to re-converge
MAX_GAP = 1024  # pieces of one side of a gap, at most
VALUE_GAP = 8  # pieces: a differing run this short is volatile whatever it is (a word, a name, an id)
SHORT_TEXT = 48  # pieces: a text this short that differs in prose, not a value, is another prompt
SHORT_GAP = 24  # pieces: a value (a name with a title, an id, a timestamp) - always volatile
SHORT_TAIL = 24  # pieces: a differing tail this short is a value at the end, not other content
CLUSTER_RUN = 12  # pieces: gaps closer than this are one span (a block's differences)
MAX_GAPS = 16  # differing spans between two requests of one template, at most: more is another prompt
MAX_REFLOWED = 1  # gaps that only move line breaks: more, and it is another layout of the prompt
MIN_SHARED = 0.35
SHORT_SHARED = 0.6  # the same for a text of fewer than SHORT_TEXT pieces (its framing is a share)  # matched pieces / pieces of the longer text, at least
MAX_PATHS = 4096  # x 2k-piece prompts x 8 bytes: 64 MiB at worst

_PIECE = re.compile(r"\s*(?:\w+|[^\w\s]+)|\s+")


def pieces(text: str) -> tuple[array[int], list[int]]:
    """(piece hashes as ``array('q')``, piece start offsets) of ``text``. The pieces tile the
    text (every character is in one), so the offsets are the running sum of their lengths."""
    found = _PIECE.findall(text)
    return array("q", map(hash, found)), [0, *accumulate(map(len, found))][:-1] if found else []


@dataclass(eq=False)
class _Node:
    edge: array[int]  # the pieces from the parent to this node (8 bytes each)
    parent: _Node | None = None
    children: dict[int, _Node] = field(default_factory=dict)
    count: int = 0  # requests whose sequence passes through (or ends at) this node
    tid: str = ""  # the first template whose sequence passes through this node


class PrefixTree:
    """A radix tree over piece sequences with a request count per node (see module docstring).

    Sequences are ``array('q')`` of piece hashes. :meth:`insert` returns the node where the
    sequence ends (its *handle*, stable across later splits) so that a caller which recognises
    a repeated prompt by its exact key can count it with :meth:`bump` without walking again."""

    def __init__(self, max_paths: int = MAX_PATHS) -> None:
        self.root = _Node(array("q"))
        self.paths = 0
        self.max_paths = max_paths

    def insert(self, seq: array[int], tid: str) -> _Node | None:
        """Count one request of template ``tid`` along ``seq``; a new branch only while fewer
        than ``max_paths`` paths exist. Returns the end node, or None when the path was not
        kept (past the bound: counted along the part that exists)."""
        node = self.root
        node.count += 1
        node.tid = node.tid or tid
        i, n = 0, len(seq)
        while i < n:
            child = node.children.get(seq[i])
            if child is None:
                if self.paths >= self.max_paths:
                    return None
                self.paths += 1
                leaf = _Node(seq[i:], parent=node, count=1, tid=tid)
                node.children[seq[i]] = leaf
                return leaf
            k = _common(child.edge, seq, i)
            if k < len(child.edge):
                if self.paths >= self.max_paths and i + k < n:
                    return None  # would need a new branch: not kept
                mid = _Node(child.edge[:k], parent=node, count=child.count, tid=child.tid)
                child.edge = child.edge[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                node.children[seq[i]] = mid
                child = mid
            child.count += 1
            child.tid = child.tid or tid
            node = child
            i += k
        return node

    @staticmethod
    def bump(node: _Node) -> None:
        """Count one more request of the sequence ending at ``node`` (O(depth in nodes))."""
        cur: _Node | None = node
        while cur is not None:
            cur.count += 1
            cur = cur.parent

    def deepest(self, seq: array[int]) -> tuple[int, str, int]:
        """(pieces of ``seq`` matched, template of the deepest node reached, its count)."""
        node = self.root
        i, n = 0, len(seq)
        while i < n:
            child = node.children.get(seq[i])
            if child is None:
                break
            k = _common(child.edge, seq, i)
            i += k
            node = child
            if k < len(child.edge):
                break
        return i, node.tid, node.count

    def count(self, seq: array[int]) -> int:
        """Requests counted through the point where ``seq`` ends (0: not a path of the tree;
        a point inside an edge has the count of the node the edge leads to)."""
        matched, _, count = self.deepest(seq)
        return count if matched == len(seq) else 0


def _common(edge: array[int], seq: array[int], i: int) -> int:
    """Length of the common prefix of ``edge`` and ``seq[i:]`` (slice compares, binary search)."""
    n = min(len(edge), len(seq) - i)
    if edge[:n] == seq[i:i + n]:
        return n
    lo, hi = 0, n  # edge[:lo] matches, edge[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if edge[lo:mid] == seq[i + lo:i + mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Alignment:
    """How two piece sequences ``a`` and ``b`` line up.

    ``gaps``: differing runs followed by re-convergence, ``(a_start, a_end, b_start, b_end)``;
    ``tail``: the runs from the last divergence to the ends when they never re-converge
    (``None`` when both sequences end aligned); ``matched``: pieces equal on both sides;
    ``runs``: the length of the equal run after each gap (same order as ``gaps``)."""

    gaps: tuple[tuple[int, int, int, int], ...]
    tail: tuple[int, int, int, int] | None
    matched: int
    runs: tuple[int, ...]


def align(a: Sequence[int], b: Sequence[int], max_gap: int = MAX_GAP,
          anchor: int = ANCHOR, max_gaps: int | None = None) -> Alignment:
    """Align ``b`` to ``a`` by re-convergence (module docstring). The anchor chosen after a
    divergence is the nearest one (smallest ``max`` of the two gap lengths); the last
    ``anchor`` - 1 pieces of both may re-converge on fewer pieces when they are all that is
    left (equal ends). With ``max_gaps``, stops after ``max_gaps + 1`` gaps, the rest a tail
    (the caller rejects such an alignment anyway)."""
    i = j = 0
    na, nb = len(a), len(b)
    gaps: list[tuple[int, int, int, int]] = []
    runs: list[int] = []
    matched = 0
    while True:
        start = i
        while i < na and j < nb and a[i] == b[j]:
            i += 1
            j += 1
        matched += i - start
        if gaps and len(runs) < len(gaps):
            runs.append(i - start)
        if i == na and j == nb:
            return Alignment(tuple(gaps), None, matched, tuple(runs))
        found = None if max_gaps is not None and len(gaps) > max_gaps else _reconverge(
            a, b, i, j, max_gap, anchor)
        if found is None:
            return Alignment(tuple(gaps), (i, na, j, nb), matched, tuple(runs))
        ia, jb = found
        gaps.append((i, ia, j, jb))
        i, j = ia, jb


def cluster(al: Alignment, min_run: int) -> Alignment:
    """``al`` with gaps separated by equal runs shorter than ``min_run`` pieces merged into one
    (and into the tail when the last run before it is that short): the differences inside one
    block of examples, memories or passages are one span, not confetti. ``matched`` is kept."""
    gaps: list[tuple[int, int, int, int]] = []
    runs: list[int] = []
    for gap, run in zip(al.gaps, al.runs, strict=False):
        if gaps and runs[-1] < min_run:
            a0, _, b0, _ = gaps[-1]
            gaps[-1] = (a0, gap[1], b0, gap[3])
            runs[-1] = run
        else:
            gaps.append(gap)
            runs.append(run)
    tail = al.tail
    if tail is not None and gaps and runs[-1] < min_run:
        a0, _, b0, _ = gaps.pop()
        runs.pop()
        tail = (a0, tail[1], b0, tail[3])
    return Alignment(tuple(gaps), tail, al.matched, tuple(runs))


def _reconverge(a: Sequence[int], b: Sequence[int], i: int, j: int, max_gap: int,
                anchor: int) -> tuple[int, int] | None:
    """The nearest re-convergence after a divergence at ``(i, j)``: the anchor positions
    ``(p, q)`` with the smallest ``max(p - i, q - j)`` (then the first found), scanning both
    sides outwards one piece per step - O(gap) for a gap, not O(max_gap)."""
    na, nb = len(a), len(b)
    seen_a: dict[tuple[int, ...], int] = {}
    seen_b: dict[tuple[int, ...], int] = {}
    last_a, last_b = na - anchor, nb - anchor
    for d in range(max_gap + 1):
        p, q = i + d, j + d
        if p > last_a and q > last_b:
            break
        if q <= last_b:
            key_b = tuple(b[q:q + anchor])
            hit = seen_a.get(key_b)
            if hit is not None:
                return hit, q
            seen_b.setdefault(key_b, q)
        if p <= last_a:
            key_a = tuple(a[p:p + anchor])
            hit = seen_b.get(key_a)
            if hit is not None:
                return p, hit
            if q <= last_b and key_a == tuple(b[q:q + anchor]):
                return p, q
            seen_a.setdefault(key_a, p)
    ends = 0  # equal last pieces, fewer than an anchor: they re-converge at the ends
    while ends < anchor and ends < na - i and ends < nb - j and a[na - 1 - ends] == b[nb - 1 - ends]:
        ends += 1
    if 0 < ends < anchor and (na - ends > i or nb - ends > j):
        return na - ends, nb - ends
    return None


_WORD = re.compile(r"[A-Za-z]+[.,;:!?'\"]*")


def prose(run: str) -> bool:
    """Whether a differing run reads as prose (another prompt's wording) rather than a value:
    no digit, only plain words, two or more of them lowercase words of four letters or more
    ("Only discuss appointments and prescriptions." - not "Maria de la Cruz", "#AB12 v2.3")."""
    words = run.split()
    if not words or any(c.isdigit() for c in run) or not all(_WORD.fullmatch(w) for w in words):
        return False
    return sum(1 for w in words if w[0].islower() and len(w.rstrip(".,;:!?'\"")) >= 4) >= 2


_BREAKS = re.compile(r"\s*\n\s*")
# A line's structural marker: a bullet or a number and the word after it ("- Likes", "3. Check"),
# or a key and its colon ("Q:", "Label:", "User name:"). Prose lines have none.
_SHAPE = re.compile(r"(?:[^\w\s]+|\d+[.):])[ \t]*\w*|\w+(?:[ \t]\w+)?:")


def _lines_shape(text: str) -> Counter[str]:
    """The line structure of a block: each non-empty line's structural marker, counted
    (digits as ``#``); lines of prose have no marker and do not count."""
    shape: Counter[str] = Counter()
    for line in text.split("\n"):
        m = _SHAPE.match(line.strip())
        if m:
            shape[re.sub(r"\d+", "#", m.group())] += 1
    return shape


def same_structure(x: str, y: str) -> bool:
    """Whether two differing blocks are the same kind of block: both two or more lines, the
    distinct line shapes (:func:`_lines_shape`) of the two at least half shared, and a shared
    shape repeated within one of them: k of n examples drawn from one pool, 3 or 9 retrieved
    passages, one user's memories and another's; not two different prompts' instructions."""
    sx, sy = _lines_shape(x), _lines_shape(y)
    nx, ny = sum(sx.values()), sum(sy.values())
    if not nx or not ny:
        return False
    if min(nx, ny) < 2:
        return False
    kinds = set(sx) | set(sy)
    shared = set(sx) & set(sy)
    return len(shared) * 2 >= len(kinds) and any(sx[k] >= 2 or sy[k] >= 2 for k in shared)


def same_template(al: Alignment, a_len: int, b_len: int, a_text: str, b_text: str,
                  a_starts: Sequence[int], b_starts: Sequence[int]) -> bool:
    """Whether aligned static parts ``a`` and ``b`` are one template (module docstring).

    The raw alignment is first :func:`cluster`-ed (gaps closer than :data:`CLUSTER_RUN` are
    one). Then: matched pieces at least :data:`MIN_SHARED` of the longer
    (:data:`SHORT_SHARED` under :data:`SHORT_TEXT` pieces); at most
    :data:`MAX_GAPS` gaps; at most :data:`MAX_REFLOWED` line breaks moved by gaps that change
    nothing else (a reflowed copy is another layout, and the findings' diff is by lines);
    every gap of at most :data:`VALUE_GAP` pieces is volatile whatever it holds (in a text of
    fewer than :data:`SHORT_TEXT` pieces only if it is no prose); a longer one is volatile when
    it is no :func:`prose` (another prompt's sentence) or sits in lines whose shape repeats in
    both texts (an example, a memory, a listed item), and, beyond :data:`SHORT_GAP` pieces,
    when the text it re-converges on is at least as long as it or both sides are blocks of the
    same line structure (:func:`same_structure`); a differing tail (nothing re-converges after
    it) is at most :data:`SHORT_TAIL` pieces and no unrepeated prose. Two prompts that share
    their first paragraphs and then go their own ways are two templates however long the
    shared part; a varying block at the very end is left to the caller's other lookups."""
    longer = max(a_len, b_len)
    if longer == 0:
        return True
    al = cluster(al, CLUSTER_RUN)
    short = longer < SHORT_TEXT
    if al.matched < (SHORT_SHARED if short else MIN_SHARED) * longer or len(al.gaps) > MAX_GAPS:
        return False
    free = 0 if short else VALUE_GAP
    shapes: tuple[Counter[str], Counter[str]] | None = None

    def lines_of(starts: Sequence[int], src: str, s: int, e: int) -> str:
        """The run's text widened to the whole lines it touches."""
        lo = starts[s] if s < len(starts) else len(src)
        hi = starts[e] if e < len(starts) else len(src)
        stop = src.find("\n", hi)
        return src[src.rfind("\n", 0, lo) + 1:len(src) if stop < 0 else stop]

    def cut(starts: Sequence[int], src: str, s: int, e: int) -> str:
        return src[starts[s] if s < len(starts) else len(src):
                   starts[e] if e < len(starts) else len(src)]

    def repeated(la: str, lb: str) -> bool:
        """Whether the first line of each side has a shape seen twice or more in its text."""
        nonlocal shapes
        if shapes is None:
            shapes = (_lines_shape(a_text), _lines_shape(b_text))
        for line, counts in ((la, shapes[0]), (lb, shapes[1])):
            shape = _lines_shape(line.split("\n", 1)[0])
            if not shape or counts[next(iter(shape))] < 2:
                return False
        return True

    def volatile(a0: int, a1: int, b0: int, b1: int, run: int | None) -> bool:
        size = max(a1 - a0, b1 - b0)
        x, y = cut(a_starts, a_text, a0, a1), cut(b_starts, b_text, b0, b1)
        if size <= free:
            return True
        if run is None and size > SHORT_TAIL:
            return False  # never re-converges: the rest is this prompt's own
        la, lb = lines_of(a_starts, a_text, a0, a1), lines_of(b_starts, b_text, b0, b1)
        if run is not None and same_structure(la, lb):
            return True
        if (prose(x) or prose(y)) and not repeated(la, lb):
            return False
        if size <= (SHORT_TAIL if run is None else SHORT_GAP):
            return True
        return run is not None and run >= size

    reflowed = 0
    for (a0, a1, b0, b1), run in zip(al.gaps, al.runs, strict=False):
        x, y = cut(a_starts, a_text, a0, a1), cut(b_starts, b_text, b0, b1)
        if x.count("\n") != y.count("\n") and "".join(x.split()) == "".join(y.split()):
            # the same words broken into other lines: count the breaks that moved
            reflowed += max(1, abs(len(_BREAKS.findall(x)) - len(_BREAKS.findall(y))))
            if reflowed > MAX_REFLOWED:
                return False
            continue
        if not volatile(a0, a1, b0, b1, run):
            return False
    return al.tail is None or volatile(*al.tail, None)
