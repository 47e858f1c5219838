"""Assign a request's static part to a template: requests that would share a prefix if their
volatile values were equal.

Three lookups, cheapest first:

1. **exact**: the static text itself (model included) was seen before -> its template.
2. **masked**: every line with its detector matches (``scan``) replaced by ``<kind>`` placeholders;
   same masked text -> same template. This absorbs dates, times, ids, emails, versions...
   :meth:`TemplateIndex.find_near` reaches the same answer without masking every line: it
   guesses the template from the text's first or last :data:`GUESS_CHARS` characters (the
   latest :data:`GUESS_TEMPLATES` templates sharing them), finds the lines where the text
   differs from that template's reference (``changed_range``) and masks only those; equal masks
   there mean equal masked texts.
3. **re-converging** (values no detector knows: names, cities, codenames, drawn examples,
   memories, retrieved passages): the template the text meets deepest in the prefix tree of
   every static part seen (:class:`.prefix_tree.PrefixTree`; and in the tree of reversed texts,
   for a value at the very start), and the latest templates sharing its first or last
   characters, are aligned with it piece by piece (:func:`.prefix_tree.align`); the first whose
   alignment differs only in volatile gaps (:func:`.prefix_tree.same_template`) is its
   template. This is how vLLM shares blocks: the same tokens before a block, whatever varies
   in between - not a similarity score.

Memory: the exact and masked maps are LRU-bounded (:data:`MAX_KEYS` each); the trees are bounded
by their paths (:data:`.prefix_tree.MAX_PATHS`); the references grow with templates only.
Cost: exact hit O(len) plus a tree count bump; masked O(lines) with a per-line cache;
re-converging O(pieces) per candidate, for static texts not seen before.
"""

from __future__ import annotations

import difflib
import re
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable

import xxhash

from templates_audit.detectors import Kind, classify
from templates_audit.detectors.shapes import name_shaped
from templates_audit.findings import changed_range, common_prefix, common_suffix, mask_line
from templates_audit.prefix_tree import (
    MAX_GAPS,
    PrefixTree,
    align,
    pieces,
    same_template,
)

__all__ = ["GUESS_CHARS", "MAX_CANDIDATES", "TemplateIndex", "mask_line"]

GUESS_CHARS = 64
GUESS_TEMPLATES = 4
MAX_CANDIDATES = 6  # templates aligned with a new static text, at most
MAX_KEYS = 1 << 16
RAW_GAPS = 4 * MAX_GAPS  # gaps aligned before clustering, at most (the cost bound)
REF_PIECES = 256  # templates whose reference pieces are kept for alignment (LRU)
LINE_SIMILARITY = 0.6
HEAD_LINES = 2
TAIL_CHARS = 64
MIN_LINES = 4
MAX_POSTING = 32
MAX_SHORT_DIFF = 64
RECENT_SHORT = 256
SKELETON_CANDIDATES = 8
SURE_SIMILARITY = 0.9  # voted line characters that make a template without aligning
CANDIDATE_SHARE = 0.3  # voted line characters a template needs to be aligned at all
WORD_OVERLAP = 0.6  # share of the larger word set a short template must share to be aligned
MAX_SLOTS = 8  # varying slots of one skeleton match
MAX_SLOT_WORDS = 8  # whitespace-separated words of one slot (a timestamp is ~6)
SKELETON_SHARE = 0.6  # characters outside the slots, of the larger text
PROSE_SLOT_WORDS = 2  # a slot that is no value ("invoices") has at most this many words ...
PROSE_SHARE = 0.02  # ... and such slots at most this share of the larger text
MAX_ALIGN_WORDS = 4000
_TOKEN = re.compile(r"\S+")



def skeleton_match(ref: str, text: str, value_like: Callable[[str, str, str], bool]) -> bool:
    """Whether ``text`` is ``ref``'s static skeleton with values in at most :data:`MAX_SLOTS`
    slots: the lines where they differ (``changed_range``) aligned word by word (whitespace
    tokens, ``difflib`` without autojunk), every differing run of at most
    :data:`MAX_SLOT_WORDS` words on either side and ``value_like`` (its request-side text, or
    the reference's for a deletion) — or a word or two of prose that together are at most
    :data:`PROSE_SHARE` of the text (a lowercase value in a long prompt) — and the slots
    together at most ``1 - SKELETON_SHARE`` of the larger text. Cost: O(words of the changed lines ^ 2) at worst, once per new static
    text that the cheaper lookups missed."""
    lo, hi = changed_range(ref, text)
    a, b = ref[lo:hi], text[lo:len(text) - (len(ref) - hi)]
    wa = [m.span() for m in _TOKEN.finditer(a)]
    wb = [m.span() for m in _TOKEN.finditer(b)]
    if max(len(wa), len(wb)) > MAX_ALIGN_WORDS:
        return False
    sm = difflib.SequenceMatcher(None, [a[x:y] for x, y in wa], [b[x:y] for x, y in wb],
                                 autojunk=False)
    slots = varying = prose = 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        slots += 1
        if slots > MAX_SLOTS or max(i2 - i1, j2 - j1) > MAX_SLOT_WORDS:
            return False
        na = wa[i2 - 1][1] - wa[i1][0] if i2 > i1 else 0
        nb = wb[j2 - 1][1] - wb[j1][0] if j2 > j1 else 0
        src, x, y = (b, wb[j1][0], wb[j2 - 1][1]) if j2 > j1 else (a, wa[i1][0], wa[i2 - 1][1])
        value = src[x:y]
        if (max(i2 - i1, j2 - j1) > PROSE_SLOT_WORDS and not name_shaped(value)) or not value_like(
                src[max(0, x - 96):x], value, src[y:y + 96]):
            prose += max(na, nb)
        varying += max(na, nb)
    larger = max(len(ref), len(text))
    return varying <= (1 - SKELETON_SHARE) * larger and prose <= PROSE_SHARE * larger


def _weighted_lines(model: str, lines: list[str]) -> dict[int, int]:
    """Distinct non-empty masked lines (hashed with the model) -> their length, the weight of a
    line in the vote."""
    return {_h(model + "\x00" + ln): len(ln.strip()) for ln in lines if ln.strip()}


def _same_ends(ref: str, text: str, head_chars: int) -> bool:
    """Whether the texts begin with the same :data:`HEAD_LINES` or more whole non-empty lines
    (``head_chars`` characters or more) and end with the same whole lines of
    :data:`TAIL_CHARS` or more characters."""
    p = common_prefix(ref, text)
    head = text[:text.rfind("\n", 0, p + 1) + 1]
    if len(head) < head_chars or sum(1 for ln in head.split("\n") if ln.strip()) < HEAD_LINES:
        return False
    s = common_suffix(ref, text, min(len(ref), len(text)) - len(head))
    nl = text.find("\n", len(text) - s)
    return nl >= 0 and len(text[nl:].strip()) >= TAIL_CHARS


def _same_head_share(ref: str, text: str) -> bool:
    """Whether the texts' shared whole leading lines are :data:`LINE_SIMILARITY` of the larger
    text: a fixed preamble and a varying end (examples drawn per request closing the prompt)."""
    head = text.rfind("\n", 0, common_prefix(ref, text) + 1) + 1
    return head >= LINE_SIMILARITY * max(len(ref), len(text))




def _h(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def _value_like(before: str, value: str, after: str) -> bool:
    """Whether a differing run of a short text is a value (a code, a number, a name, anything a
    detector knows) rather than prose ("helpful assistant" / "pirate")."""
    if not value.strip() or len(value.split()) > 6:
        return False
    if len(value.split()) == 1 and any(c.isdigit() for c in value):
        return True
    return classify(before[-96:], value, after[:96]) is not Kind.OTHER or name_shaped(value) or (
        value[:1].isupper() and len(value.split()) <= 3)


def _seq(model: str, text: str) -> tuple[array[int], array[int], list[int]]:
    """The text's pieces after one for the model (templates never span models), the same
    reversed behind the model piece (the reversed tree's key), and the pieces' offsets."""
    hashes, starts = pieces(text)
    hashes.insert(0, hash("\x00model:" + model))
    rev = array("q", hashes[:1])
    rev.extend(reversed(hashes[1:]))
    return hashes, rev, starts


class TemplateIndex:
    """Maps static texts to template ids (see the module docstring)."""

    def __init__(self, value_like: Callable[[str, str, str], bool] | None = None) -> None:
        self._value_like = value_like or _value_like
        # the line vote of the fallback (step 4)
        self._postings: dict[int, list[str]] = {}
        self._nlines: dict[str, int] = {}
        self._nchars: dict[str, int] = {}  # characters of a template's distinct voting lines
        self._short: dict[str, deque[tuple[str, str]]] = {}
        self._words: dict[str, frozenset[str]] = {}  # a short template's words
        self._exact: OrderedDict[int, str] = OrderedDict()
        self._masked: OrderedDict[int, str] = OrderedDict()
        # find_near: each template's reference text and masked key, and the latest
        # GUESS_TEMPLATES templates per (model, first or last GUESS_CHARS characters of it).
        self._refs: dict[str, tuple[str, int]] = {}
        self._guess: dict[tuple[str, str], deque[str]] = {}
        # Every distinct static part seen (bounded), forwards and reversed; the node where a
        # kept exact key's path ends, to count its repeats.
        self.tree = PrefixTree()
        self.rtree = PrefixTree()
        self._ends: OrderedDict[int, object] = OrderedDict()
        self._tpl_end: dict[str, object] = {}  # where each template's reference path ends
        self._ref_pieces: OrderedDict[str, tuple[array[int], array[int], list[int]]] = OrderedDict()

    @staticmethod
    def _remember(lru: OrderedDict[int, str], key: int, tid: str) -> None:
        lru[key] = tid
        lru.move_to_end(key)
        if len(lru) > MAX_KEYS:
            lru.popitem(last=False)

    def lookup_exact(self, model: str, text: str) -> tuple[str | None, int]:
        key = _h(model + "\x00" + text)
        tid = self._exact.get(key)
        if tid is not None:
            self._exact.move_to_end(key)
            end = self._ends.get(key)
            if end is not None:
                PrefixTree.bump(end)  # type: ignore[arg-type]
        return tid, key

    def find(self, model: str, text: str, exact_key: int) -> tuple[str | None, str]:
        """(template id or None, masked key hex). Call after :meth:`lookup_exact` missed."""
        lines = list(map(mask_line, text.split("\n")))
        masked = "\n".join(lines)
        mkey = _h(model + "\x00" + masked)
        tid = self._masked.get(mkey)
        seq: tuple[array[int], array[int], list[int]] | None = None
        if tid is None:
            seq = _seq(model, text)
            tid = self._reconverging(model, text, seq) or self._similar(model, text, lines)
            if tid is not None:
                self._remember(self._masked, mkey, tid)
        if tid is not None:
            self._remember(self._exact, exact_key, tid)
            if seq is None:  # equal to the template's reference but for detector values
                self._count_as(exact_key, tid)
            else:
                self._grow(model, text, exact_key, tid, seq)
        return tid, f"{mkey:016x}"

    def find_near(self, model: str, text: str, exact_key: int) -> tuple[str, tuple[int, int]] | None:
        """What :meth:`find` returns when the text's masked key is a template's reference's —
        found by masking only the lines where the text differs from a guessed template — and
        those lines' ``changed_range``; None: ask :meth:`find`. Call after
        :meth:`lookup_exact` missed."""
        for guess in (text[:GUESS_CHARS], text[-GUESS_CHARS:]):
            for tid in self._guess.get((model, guess), ()):
                ref, mkey = self._refs[tid]
                lo, hi = changed_range(ref, text)
                # Both texts agree outside these whole lines, and masking works line by line
                # (lines masked here are cached for find, should the guess be wrong).
                ours = text[lo:len(text) - (len(ref) - hi)].split("\n")
                theirs = ref[lo:hi].split("\n")
                if (len(ours) == len(theirs)
                        and list(map(mask_line, ours)) == list(map(mask_line, theirs))
                        and self._masked.get(mkey) == tid):
                    self._remember(self._exact, exact_key, tid)
                    self._count_as(exact_key, tid)
                    return tid, (lo, hi)
        return None

    def add(self, tid: str, model: str, text: str, exact_key: int) -> None:
        """Register a new template whose reference static text is ``text``."""
        lines = list(map(mask_line, text.split("\n")))
        mkey = _h(model + "\x00" + "\n".join(lines))
        self._remember(self._exact, exact_key, tid)
        self._remember(self._masked, mkey, tid)
        self._refs[tid] = (text, mkey)
        for guess in {text[:GUESS_CHARS], text[-GUESS_CHARS:]}:
            self._guess.setdefault((model, guess), deque(maxlen=GUESS_TEMPLATES)).appendleft(tid)
        self._grow(model, text, exact_key, tid, None)
        end = self._ends.get(exact_key)
        if end is not None:
            self._tpl_end[tid] = end
        distinct = _weighted_lines(model, lines)
        self._nlines[tid] = len(distinct)
        self._nchars[tid] = sum(distinct.values())
        if len(distinct) >= MIN_LINES:
            for lh in distinct:
                self._postings.setdefault(lh, []).append(tid)
        else:
            short = self._short.setdefault(model, deque(maxlen=RECENT_SHORT))
            if len(short) == short.maxlen:
                self._words.pop(short[-1][0], None)
            short.appendleft((tid, text))
            self._words[tid] = frozenset(text.split())

    def remove(self, tid: str, model: str, text: str, exact_key: int) -> None:
        """Forget template ``tid`` (reference ``text``, added with ``exact_key``): a later
        request like it starts a new template. Its paths stay in the trees (bounded), whose
        nodes then name a template that is no longer a candidate."""
        if self._exact.get(exact_key) == tid:
            del self._exact[exact_key]
        self._ends.pop(exact_key, None)
        self._tpl_end.pop(tid, None)
        self._ref_pieces.pop(tid, None)
        _, mkey = self._refs.pop(tid)
        if self._masked.get(mkey) == tid:
            del self._masked[mkey]
        for guess in {text[:GUESS_CHARS], text[-GUESS_CHARS:]}:
            recent = self._guess.get((model, guess))
            if recent is not None and tid in recent:
                recent.remove(tid)
                if not recent:
                    del self._guess[(model, guess)]
        self._nchars.pop(tid, None)
        self._words.pop(tid, None)
        if self._nlines.pop(tid, 0) >= MIN_LINES:
            for line in {ln for ln in map(mask_line, text.split("\n")) if ln.strip()}:
                lh = _h(model + "\x00" + line)
                post = self._postings.get(lh)
                if post is not None and tid in post:
                    post.remove(tid)
                    if not post:
                        del self._postings[lh]
        else:
            short = self._short.get(model)
            if short is not None and (tid, text) in short:
                short.remove((tid, text))

    def _count_as(self, exact_key: int, tid: str) -> None:
        """Count a static part that equals template ``tid``'s reference once detector values
        are masked on the reference's path (no walk, no insertion: the hot path of a trace
        whose prompts differ in dates and ids only)."""
        end = self._tpl_end.get(tid)
        if end is not None:
            PrefixTree.bump(end)  # type: ignore[arg-type]
            self._end_at(exact_key, end)

    def _end_at(self, exact_key: int, end: object) -> None:
        """Remember where ``exact_key``'s path ends (LRU-bounded like the exact map)."""
        self._ends[exact_key] = end
        if len(self._ends) > MAX_KEYS:
            self._ends.popitem(last=False)

    def _grow(self, model: str, text: str, exact_key: int, tid: str,
              seq: tuple[array[int], array[int], list[int]] | None) -> None:
        """Insert a static part seen for the first time (a template's reference, or a part
        found by re-convergence) into both trees."""
        hashes, rev, _ = seq or _seq(model, text)
        end = self.tree.insert(hashes, tid)
        self.rtree.insert(rev, tid)
        if end is not None:
            self._end_at(exact_key, end)

    def _reconverging(self, model: str, text: str, seq: tuple[array[int], array[int], list[int]]
                      ) -> str | None:
        """The first candidate template whose reference differs from ``text`` only in volatile
        gaps (module docstring, step 3)."""
        hashes, rev, starts = seq
        candidates: list[str] = []
        for tree, key in ((self.tree, hashes), (self.rtree, rev)):
            depth, tid, _ = tree.deepest(key)
            if depth > 1 and tid in self._refs and tid not in candidates:
                candidates.append(tid)
        for guess in (text[:GUESS_CHARS], text[-GUESS_CHARS:]):
            for tid in self._guess.get((model, guess), ()):
                if tid not in candidates:
                    candidates.append(tid)
        for tid in candidates[:MAX_CANDIDATES]:
            ref = self._refs[tid][0]
            cached = self._ref_pieces.get(tid)
            if cached is None:
                cached = self._ref_pieces[tid] = _seq(model, ref)
                if len(self._ref_pieces) > REF_PIECES:
                    self._ref_pieces.popitem(last=False)
            else:
                self._ref_pieces.move_to_end(tid)
            rh, _, rs = cached
            al = align(rh, hashes, max_gaps=RAW_GAPS)
            if same_template(al, len(rh), len(hashes), ref, text, [0, *rs], [0, *starts]):
                return tid
        return None


    def _similar(self, model: str, text: str, lines: list[str]) -> str | None:
        distinct = _weighted_lines(model, lines)
        if len(distinct) >= MIN_LINES:
            votes: dict[str, int] = {}
            for lh, weight in distinct.items():
                post = self._postings.get(lh)
                if post is None or len(post) > MAX_POSTING:
                    continue
                for tid in post:
                    votes[tid] = votes.get(tid, 0) + weight
            ranked = sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))[:SKELETON_CANDIDATES]
            total = sum(distinct.values())
            if ranked:
                tid, weight = ranked[0]
                larger = max(total, self._nchars[tid])
                ref = self._refs[tid][0]
                # A vote alone settles it only when nearly every line is shared; otherwise the
                # texts must also share their first and last whole lines (a varying block
                # between them) or align as one skeleton.
                if weight >= LINE_SIMILARITY * larger and (
                        weight >= SURE_SIMILARITY * larger or _same_ends(ref, text, 0)
                        or _same_head_share(ref, text)
                        or skeleton_match(ref, text, self._value_like)):
                    return tid
            for tid, weight in ranked:
                if (weight >= CANDIDATE_SHARE * max(total, self._nchars[tid])
                        and skeleton_match(self._refs[tid][0], text, self._value_like)):
                    return tid
            return self._same_head(model, text)
        words = frozenset(text.split())
        for tid, ref in self._short.get(model, ()):
            theirs = self._words[tid]
            if len(words & theirs) < WORD_OVERLAP * max(len(words), len(theirs)):
                continue
            if self._one_value_apart(ref, text) or skeleton_match(ref, text, self._value_like):
                return tid
        return None

    def _one_value_apart(self, ref: str, text: str) -> bool:
        """Equal but for one middle run of at most :data:`MAX_SHORT_DIFF` characters that is a
        value (the cheap test before :func:`skeleton_match`)."""
        p = common_prefix(ref, text)
        s = common_suffix(ref, text, min(len(ref), len(text)) - p)
        mid_ref, mid = ref[p:len(ref) - s], text[p:len(text) - s]
        if max(len(mid_ref), len(mid)) > MAX_SHORT_DIFF:
            return False
        # Widen to whole words: the diff may start inside one ("Al|ice" vs "Al|an").
        while p > 0 and text[p - 1].isalnum():
            p -= 1
        while s > 0 and text[len(text) - s].isalnum():
            s -= 1
        return self._value_like(text[:p], text[p:len(text) - s], text[len(text) - s:])

    def _same_head(self, model: str, text: str) -> str | None:
        """A recent template whose reference starts with the same :data:`HEAD_LINES` or more
        whole non-empty lines (at least :data:`GUESS_CHARS` characters) and ends with the same
        whole lines of :data:`TAIL_CHARS` or more characters: what lies between is an injected
        multi-line block (retrieved documents, a user profile) that varies. Different prompts
        of one vendor share a preamble but not their last lines, so they stay apart."""
        for tid in self._guess.get((model, text[:GUESS_CHARS]), ()):
            if _same_ends(self._refs[tid][0], text, GUESS_CHARS):
                return tid
        return None
