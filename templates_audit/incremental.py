"""Exact incremental tokenisation: reuse the tokens of a text already encoded, encode the rest.

A prompt usually repeats most of an earlier one — a shared system prompt, the previous turn of
a conversation, a template with one value changed. :class:`IncrementalEncoder` keeps recent
encodings (:class:`Encoded`) in a bounded cache keyed by text prefix and, for a new text, splices
the new tokens into those of the cached text that shares the longest prefix:

1. ``c`` = the first character where the texts differ; walk back over the old text's tokens to
   the last *restart point* ``b`` whose cut is proven for any continuation that agrees up to
   ``c`` (:meth:`.tokenizer_rules.Rules.need`: added-token splits always; word starts and, for a
   BPE model without pre-tokenizer, never-merged character pairs when the tokenizer allows);
2. encode from ``b`` with the library itself — from a split start with the tokenizer as loaded,
   inside a split with its per-split prefixes turned off (:attr:`Rules.mid`);
3. when the old text resumes after the edit (the next line is the same, a later line is found in
   it, or the two end alike), encode only a window past the edit and, at a word start of the
   window that is also a cut of the old text at the same place in the shared text, go back to
   copying the old tokens — until the next difference, where 1-3 repeat (at most
   :data:`MAX_SEGMENTS` times).

The result is token-for-token the library's ``encode(text)`` (ids and offsets): every copied token
lies between two proven cuts of identical text, every encoded one comes from the library; tokenizers
whose cuts cannot be proven encode whole texts (``rules.level == 0``). As a safety net the first
:data:`CHECKS` splices of each encoder are compared with a full encode; a mismatch turns splicing
off for good (``disabled``). Not thread-safe (one encoder per thread or event loop).

The cache: an LRU of :class:`Encoded` bounded by ``cache_tokens`` tokens in total; each entry is
indexed by the xxh3 digests of its UTF-8 prefixes at 32, 64, ... 2,048 bytes and every 2,048
bytes after (the newest entry owns a digest), plus its whole text. A lookup hashes the new text
once and takes the entry under its deepest matching digest. Memory per cached token: about 25
bytes (id, start offsets, one flag byte) plus the text.

Cost of a splice: one UTF-8 encode and hash of the text, a common-prefix scan (C slice compares),
a few ``need`` checks, the library's encode of the changed region plus a margin (typically a few
dozen tokens), and list copies of the reused tokens. A text the cache cannot help costs one
library encode plus a pass over its tokens.
"""

from __future__ import annotations

import bisect
import json
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain, repeat
from operator import add, itemgetter, ne
from typing import Any

import xxhash

from templates_audit.tokenizer_rules import (
    KIND_FORCED,
    KIND_SPLIT,
    KIND_WORD,
    LEVEL_SPLITS,
    WHITE_SPACE,
    Rules,
    analyse,
    byte_level_char,
)

__all__ = ["CHECKS", "DEFAULT_CACHE_TOKENS", "MAX_SEGMENTS", "Encoded", "IncrementalEncoder"]

DEFAULT_CACHE_TOKENS = 1 << 20
MIN_CHARS = 64  # shorter texts are encoded whole and not cached
MAX_SEGMENTS = 8  # edits spliced around per text; the rest is encoded whole
CHECKS = 3  # splices per encoder compared with a full encode
SIBLING_TAIL = 256  # a text differing from its base only in a tail this short is not cached
MAX_WALK = 512  # tokens walked back from a difference looking for a restart point
_WINDOW = 32  # characters encoded past a realignment before looking for a resync point
_ADDED_REACH = 512  # an edit ending this close before an added token resyncs at that token
_MIN_TAIL = 128  # a difference this close to the end: encode to the end
_MIN_REUSE = 64  # shorter common stretches between two differences are part of the edit
_GRID = (32, 64, 128, 256, 512, 1024, 2048)
_GRID_STEP = 2048

WORD, ADDED = 1, 2  # token flags: first token of a word; a raw added token
_first = itemgetter(0)
_SPACE_CHAR = byte_level_char(32)


class Encoded:
    """A text and its exact tokens; read-only once built (lists are shared with the cache).

    ``ids``/``starts``: what the tokenizer's ``encode`` returns (ids, start character offset of
    each token, post-processor tokens included). ``raw``/``flags``: per token of the text alone,
    the untrimmed start and :data:`WORD`/:data:`ADDED` bits — the restart points. Offsets are
    ``array('i')``: copied by memcpy, nothing for the garbage collector to visit."""

    __slots__ = ("_hashes", "_keys", "_seed", "flags", "ids", "raw", "starts", "text")

    def __init__(self, text: str, ids: list[int], starts: array[int], raw: array[int],
                 flags: bytearray | bytes, seed: tuple[dict[Any, list[int]], int] | None = None
                 ) -> None:
        self.text = text
        self.ids = ids
        self.starts = starts
        self.raw = raw
        self.flags = flags
        self._hashes: dict[Any, list[int]] = {}
        self._keys: list[int] = []
        # (the base's block hashes, leading tokens equal to the base's): reused by block_hashes
        self._seed = seed

    def block_hashes(self, block_size: int, salt: str | None = None) -> list[int]:
        """Chained hashes of the full blocks (:func:`.blocks.block_hashes`), kept; the blocks
        this text shares with the encoding it was spliced from reuse that one's hashes."""
        key = (block_size, salt)
        hashes = self._hashes.get(key)
        if hashes is not None:
            return hashes
        from templates_audit.blocks import block_hashes

        known: list[int] = []
        if self._seed is not None:
            base, shared = self._seed
            known = (base.get(key) or [])[:shared // block_size]
        ids = self.ids
        if known:
            hashes = known + block_hashes(ids[len(known) * block_size:len(ids) // block_size
                                              * block_size], block_size, parent=known[-1])
        else:
            hashes = block_hashes(ids, block_size, salt)
        self._hashes[key] = hashes
        return hashes


class _Parts:
    """Token lists of the text being built (the body: post-processor tokens excluded).
    ``starts`` (trimmed offsets) only when the post-processor trims; else they are ``raw``."""

    __slots__ = ("flags", "ids", "raw", "starts", "trimmed")

    def __init__(self, trimmed: bool) -> None:
        self.ids: list[int] = []
        self.raw = array("i")
        self.starts = array("i")
        self.flags = bytearray()
        self.trimmed = trimmed

    def copy(self, enc: Encoded, pre: int, lo: int, hi: int, shift: int) -> None:
        """Body tokens ``lo:hi`` of ``enc``, their offsets moved by ``shift``."""
        if hi <= lo:
            return
        first = not self.ids  # the usual case: one slice, no temporary list
        ids = enc.ids[pre + lo:pre + hi]
        raw = enc.raw[lo:hi]
        if shift:
            raw = array("i", map(add, raw, repeat(shift)))
        if first:
            self.ids, self.raw = ids, raw
            self.flags = enc.flags[lo:hi] if isinstance(enc.flags, bytearray) else bytearray(
                enc.flags[lo:hi])
        else:
            self.ids += ids
            self.raw += raw
            self.flags += enc.flags[lo:hi]
        if self.trimmed:
            starts = enc.starts[pre + lo:pre + hi]
            if shift:
                starts = array("i", map(add, starts, repeat(shift)))
            if first:
                self.starts = starts
            else:
                self.starts += starts

    def extend(self, other: _Parts) -> None:
        self.ids += other.ids
        self.raw += other.raw
        self.starts += other.starts
        self.flags += other.flags

    def cut(self, n: int) -> None:
        """Keep the first ``n`` tokens."""
        for lst in (self.ids, self.raw, self.starts):
            del lst[n:]
        del self.flags[n:]


class IncrementalEncoder:
    """Exact ``encode`` of a Hugging Face tokenizer with reuse (see the module docstring).

    ``tokenizer``: a ``tokenizers.Tokenizer`` (its truncation and padding are turned off) or
    its JSON. ``add_special_tokens``: as ``Tokenizer.encode``'s (vLLM's chat path: False)."""

    def __init__(self, tokenizer: Any, *, add_special_tokens: bool = False,
                 cache_tokens: int = DEFAULT_CACHE_TOKENS, min_chars: int = MIN_CHARS,
                 checks: int = CHECKS) -> None:
        from tokenizers import Tokenizer

        if isinstance(tokenizer, str):
            tokenizer = Tokenizer.from_str(tokenizer)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._reference = tokenizer
        self.add_special_tokens = add_special_tokens
        special = bool(getattr(tokenizer, "encode_special_tokens", False))
        canonical = json.loads(tokenizer.to_str())
        normalizers: dict[str, Any] = {}

        def normalize(norm: Any, ch: str) -> str:
            if norm is None:
                return ch
            key = json.dumps(norm, sort_keys=True)
            tok = normalizers.get(key)
            if tok is None:
                tok = normalizers[key] = Tokenizer.from_str(json.dumps({**canonical,
                                                                        "normalizer": norm}))
            return str(tok.normalizer.normalize_str(ch))

        self.rules: Rules = analyse(canonical, add_special_tokens=add_special_tokens,
                                    skip_special=special, normalize=normalize)
        normalizers.clear()  # only the analysis needed them
        # Chunks are encoded without special tokens, where a post-processor only trims
        # offsets: without trims the tokenizer itself serves (one vocabulary in memory).
        self._head = (tokenizer if not self.rules.trims
                      else Tokenizer.from_str(json.dumps(self.rules.head)))
        self._mid = (Tokenizer.from_str(json.dumps(self.rules.mid)) if self.rules.mid is not None
                     else self._head)
        for tok in (self._head, self._mid):
            tok.encode_special_tokens = special
        self._added = self.rules.added.raw_ids
        self._pre = list(self.rules.prefix_ids)
        self._post = list(self.rules.suffix_ids)
        self.min_chars = min_chars
        self.checks = checks
        self.disabled = ""  # why splicing was turned off, if it was
        self._diverged = 0  # where the last splice's text first differed from its base
        self.stats = {"fresh": 0, "spliced": 0, "repeats": 0, "checked": 0, "encoded_tokens": 0,
                      "reused_tokens": 0}
        self._index = _PrefixIndex(cache_tokens)

    # -- public ------------------------------------------------------------------------------
    def encode(self, text: str) -> Encoded:
        """The encoding of ``text``, reusing a cached one that shares a prefix with it."""
        if len(text) < self.min_chars:
            return self.fresh(text)
        index = self._index
        data = text.encode("utf-8", "surrogatepass")
        whole = xxhash.xxh3_64_intdigest(data, 1)
        hit = index.exact(whole, text)
        if hit is not None:
            self.stats["repeats"] += 1
            return hit
        found = index.base(data) if self.rules.level >= LEVEL_SPLITS else None
        if found is None:
            enc = self.fresh(text)
        else:
            base, depth = found
            # An ASCII text's byte grid is its character grid: the texts very likely agree
            # up to the point whose digest matched (checked, then scanned on from there).
            hint = depth if len(data) == len(text) and base.text.isascii() else 0
            enc = self.splice(base, text, hint)
            # A sibling of its base (same text but a short tail: a new user turn under a cached
            # system prompt) adds nothing the base does not offer to later texts, bar its own
            # repeats and continuations, which cost a short tail to encode again.
            if len(base.text) > self._diverged >= len(text) - SIBLING_TAIL:
                return enc
        index.add(enc, _digests(data), whole)
        return enc

    def fresh(self, text: str) -> Encoded:
        """``text`` encoded whole (not cached)."""
        self.stats["fresh"] += 1
        parts = self._encode(text, 0, len(text), KIND_SPLIT, _Parts(bool(self.rules.trims)))
        return self._finish(text, parts, None)

    def splice(self, base: Encoded, text: str, hint: int = 0) -> Encoded:
        """``text`` encoded by reusing ``base``'s tokens wherever a proven cut allows
        (``hint``: characters the two texts probably share at the start)."""
        self._diverged = 0
        if self.disabled or self.rules.level < LEVEL_SPLITS or not base.raw:
            return self.fresh(text)
        self.stats["spliced"] += 1
        enc = self._splice(base, text, hint)
        if self.checks > 0:
            self.checks -= 1
            stats = self.stats
            counted = stats["fresh"], stats["encoded_tokens"]
            ref = self.fresh(text)
            stats["fresh"], stats["encoded_tokens"] = counted  # checks are counted apart
            stats["checked"] += 1
            if (ref.ids, ref.starts, ref.raw, ref.flags) != (enc.ids, enc.starts, enc.raw,
                                                           enc.flags):
                self.disabled = f"a splice disagreed with the full encode ({self.rules.family})"
                return ref
        return enc

    def reference(self, text: str) -> tuple[list[int], list[int]]:
        """The library's own ``encode(text)``: ids and start offsets (tests compare to it)."""
        enc = self._reference.encode(text, add_special_tokens=self.add_special_tokens)
        return list(enc.ids), [s for s, _ in enc.offsets]

    # -- splicing ----------------------------------------------------------------------------
    def _splice(self, old: Encoded, text: str, hint: int) -> Encoded:
        rules = self.rules
        pre = len(self._pre)
        otext = old.text
        out = _Parts(bool(rules.trims))
        k_from = 0  # next body token of old to copy
        delta = 0  # old position = new position + delta
        t_pos = 0  # where the current run of copied tokens starts (new text)
        lo = 0  # restart points must not precede the last resync point (old text)
        lo_kind = KIND_SPLIT
        segments = 0
        reused = 0
        shared = -1  # leading tokens equal to old's (the first copied run)
        n = len(text)
        while True:
            c = t_pos + _common_prefix(text, otext, t_pos, t_pos + delta, hint)
            if not segments:
                self._diverged = c
            hint = 0
            if c == n and c + delta == len(otext):
                out.copy(old, pre, k_from, len(old.raw), -delta)
                reused += len(old.raw) - k_from
                break
            found = self._restart(old, lo, c + delta)
            if found is None:
                b_old, k_b, kind = lo, k_from, lo_kind
            else:
                b_old, k_b, kind = found
            out.copy(old, pre, k_from, k_b, -delta)
            reused += k_b - k_from
            if shared < 0:
                shared = k_b
            b = b_old - delta
            segments += 1
            window = self._edit(text, otext, old, b, kind, c, delta, segments, len(out.ids))
            if window is None:  # encode to the end
                self._encode(text, b, n, kind, out)
                break
            parts, t, k_o, t_kind, new_delta = window
            out.extend(parts)
            k_from, t_pos, delta, lo, lo_kind = k_o, t, new_delta, t + new_delta, t_kind
        self.stats["reused_tokens"] += reused
        if shared < 0:
            shared = len(out.ids)
        return self._finish(text, out, (old._hashes, pre + shared))

    def _restart(self, old: Encoded, lo: int, c: int) -> tuple[int, int, int] | None:
        """The last restart point ``b >= lo`` of ``old`` (its position, body token, kind) whose
        cut holds for any text that agrees with ``old`` before ``c``."""
        raw, flags, text = old.raw, old.flags, old.text
        need = self.rules.need
        forced = self.rules.boundary == "forced"
        gap = 3 if self.rules.boundary == "regex" else 1
        i = bisect.bisect_left(raw, c) - 1
        walked = 0
        while i >= 0 and walked < MAX_WALK:
            b = raw[i]
            if b < lo:
                break
            walked += 1
            if b == 0:
                return 0, 0, KIND_SPLIT
            if i and raw[i - 1] == b:
                i -= 1
                continue
            kind = _kind(flags, i, forced) if i else KIND_WORD
            # a cut inside a split needs agreement past b (regex words: three characters)
            if kind is not None and (kind == KIND_SPLIT or b + gap <= c) and need(
                    text, b, kind) <= c:
                return b, i, kind
            i -= 1
        return (0, 0, KIND_SPLIT) if lo == 0 else None

    def _edit(self, text: str, otext: str, old: Encoded, b: int, kind: int, c: int, delta: int,
              segments: int, index: int) -> tuple[_Parts, int, int, int, int] | None:
        """Tokens from ``b`` past the edit at ``c`` up to a resync point: (their parts, the
        resync position, old's body token there, its kind, the new delta); None: encode to
        the end."""
        n = len(text)
        if segments < MAX_SEGMENTS:
            found = self._resync_added(text, old, b, kind, c, delta, index)
            if found is not None:
                return found
        scan = c
        while segments < MAX_SEGMENTS and n - scan >= _MIN_TAIL:
            r = _realign(text, otext, scan, delta)
            if r is None:
                return None
            r_new, r_old = r
            c2 = r_new + _common_prefix(text, otext, r_new, r_old)
            if c2 <= scan:
                return None
            if c2 - r_new >= _MIN_REUSE or c2 == n:
                found = self._resync(text, old, b, kind, r_new, c2, r_old - r_new,
                                     index)
                if found is not None:
                    return found
            scan = c2
        return None

    def _resync_added(self, text: str, old: Encoded, b: int, kind: int, c: int,
                      delta: int, index: int) -> tuple[_Parts, int, int, int, int] | None:
        """Resync at the first added-token split of ``text`` after ``c`` when ``old`` has the
        same token, chosen, where the two agree again: the chunk from ``b`` then ends at a
        split end, and the token and what follows are copied."""
        added = self.rules.added
        if added.single_word or added.lmax == 0:
            return None
        # No scan of the rest of a long text: a split whose token starts within the reach is
        # found in text[:stop] as in the whole text (literal patterns of at most lmax
        # characters), and one found starting past the reach is refused either way. A token
        # that strips whitespace on its left can start a split before its match: search all.
        stop = len(text) if added.lstrip else min(len(text), c + _ADDED_REACH + added.lmax)
        pos = b
        while True:  # the splits the library chooses from b on, up to the first one after c
            found = added.next_split(text, pos, stop)
            if found is None or found[0] - c > _ADDED_REACH:
                return None
            s, e = found
            if s >= c:
                break
            pos = e
        otext = old.text
        probe = text[s:s + max(32, added.lmax + 1)]
        o = otext.find(probe, c + delta)
        if o < 0:
            return None
        oraw = old.raw
        k = bisect.bisect_left(oraw, o)
        if k >= len(oraw) or oraw[k] != o or not old.flags[k] & ADDED or (k and oraw[k - 1] == o):
            return None
        parts = self._encode(text, b, s, kind, _Parts(bool(self.rules.trims)), index)
        return parts, s, k, KIND_SPLIT, o - s

    def _resync(self, text: str, old: Encoded, b: int, b_kind: int, r: int, c2: int,
                delta: int, index: int) -> tuple[_Parts, int, int, int, int] | None:
        """Encode ``text`` from ``b`` through a window past ``r`` (where ``text[r:c2]`` equals
        ``old.text[r + delta:]``) and find a cut of both texts there: a restart point of the
        new text whose context it inspects lies in the window and in the shared stretch, at a
        token start of ``old`` of the same kind. ``index``: body tokens before ``b``."""
        rules = self.rules
        forced = rules.boundary == "forced"
        n = len(text)
        first = r + max(rules.added.lmax, 1) + 1  # the cut's context lies in the shared text
        if first >= c2:
            return None
        end = min(n, first + _WINDOW)
        oraw, oflags = old.raw, old.flags
        while True:
            parts = self._encode(text, b, end, b_kind, _Parts(bool(rules.trims)), index)
            raw, flags = parts.raw, parts.flags
            limit = min(end, c2)
            j = max(1, bisect.bisect_left(raw, first))
            while j < len(raw):
                t = raw[j]
                if t >= c2:
                    break
                kind = _kind(flags, j, forced) if raw[j - 1] != t else None
                if kind is not None and rules.need(text, t, kind) <= limit:
                    o = t + delta
                    k = bisect.bisect_left(oraw, o)
                    if (0 < k < len(oraw) and oraw[k] == o and oraw[k - 1] != o
                            and _kind(oflags, k, forced) == kind):
                        parts.cut(j)
                        return parts, t, k, kind, delta
                j += 1
            if end >= min(n, c2):
                return None
            end = min(n, c2, first + (end - first) * 4)

    # -- encoding ----------------------------------------------------------------------------
    def _encode(self, text: str, start: int, end: int, kind: int, parts: _Parts,
                index: int = 0) -> _Parts:
        """Append to ``parts`` the library's tokens of ``text[start:end]`` as they are in
        ``text`` — a chunk from a split start (or inside a split: per-split prefixes off, the
        head tokenizer again from the chunk's first added token on); offsets in ``text``;
        ``kind``: the restart kind at ``start`` (a chunk starting at a forced cut inside a word
        does not start a word); ``index``: body tokens of the text before ``parts``."""
        rules = self.rules
        if start >= end:
            return parts
        split_start = kind == KIND_SPLIT
        if split_start and (rules.prefixing != "first" or start == 0):
            calls = [(self._head, start, end)]
        elif rules.prefixing == "split":
            s1 = rules.added.first_split(text, start, end)
            if s1 is None:
                calls = [(self._mid, start, end)]
            elif s1 == start:
                calls = [(self._head, start, end)]
            else:
                calls = [(self._mid, start, s1), (self._head, s1, end)]
        else:
            calls = [(self._mid, start, end)]
        before = len(parts.ids)
        for tok, lo, hi in calls:
            self._call(tok, text, lo, hi, parts, index)
        if kind == KIND_FORCED and len(parts.ids) > before:
            parts.flags[before] &= ~WORD
        self.stats["encoded_tokens"] += len(parts.ids) - before
        return parts

    def _call(self, tok: Any, text: str, lo: int, hi: int, parts: _Parts, index: int) -> None:
        enc = tok.encode(text[lo:hi], add_special_tokens=False)
        ids = enc.ids
        offsets = enc.offsets
        words = enc.word_ids
        raw = array("i", map(add, map(_first, offsets), repeat(lo)) if lo else map(_first, offsets))
        # WORD where the word id changes; ADDED on raw added tokens (each its own split).
        flags = bytearray(map(ne, words, chain((None,), words)))
        added = self._added
        if not added.isdisjoint(ids):
            for i in [i for i, t in enumerate(ids) if t in added]:
                flags[i] = WORD | ADDED
        if parts.trimmed:
            parts.starts += array("i", _trim(self.rules.trims, enc.tokens, raw,
                                             [e + lo for _, e in offsets], index + len(parts.ids)))
        parts.ids += ids
        parts.raw += raw
        parts.flags += flags

    def _finish(self, text: str, parts: _Parts, seed: tuple[dict[Any, list[int]], int] | None
                ) -> Encoded:
        pre, post = self._pre, self._post
        ids = parts.ids
        starts = parts.starts if parts.trimmed else parts.raw
        if pre or post:
            ids = pre + ids + post
            starts = array("i", bytes(4 * len(pre))) + starts + array("i", bytes(4 * len(post)))
        return Encoded(text, ids, starts, parts.raw, parts.flags, seed)


def _kind(flags: bytearray | bytes, i: int, forced: bool) -> int | None:
    """The restart kind of body token ``i`` (None: not a restart point)."""
    f = flags[i]
    if f & ADDED:
        return None  # restart after the added token, where its split ends
    if f & WORD:
        return KIND_SPLIT if i == 0 or flags[i - 1] & ADDED else KIND_WORD
    return KIND_FORCED if forced else None


def _trim(trims: tuple[bool, ...], tokens: list[str], starts: Sequence[int], ends: list[int],
          index: int) -> list[int]:
    """ByteLevel's ``process_offsets`` on these tokens (``index``: tokens before them)."""
    starts = list(starts)
    for add_prefix_space in trims:
        for i, tok in enumerate(tokens):
            lead = 0
            for ch in tok:
                if ch != _SPACE_CHAR and ch not in WHITE_SPACE:
                    break
                lead += 1
            if lead == len(tok):
                trail = lead
            else:
                trail = 0
                for ch in reversed(tok):
                    if ch != _SPACE_CHAR and ch not in WHITE_SPACE:
                        break
                    trail += 1
            if lead:
                if (index + i == 0 or starts[i] == 0) and add_prefix_space and lead == 1:
                    lead = 0
                starts[i] = min(starts[i] + lead, ends[i])
            if trail and ends[i] >= trail:
                ends[i] = max(ends[i] - trail, starts[i])
    return starts


# -- text comparisons ------------------------------------------------------------------------------

def _common_prefix(a: str, b: str, i: int, j: int, hint: int = 0) -> int:
    """Length of the common prefix of ``a[i:]`` and ``b[j:]``: galloping probes (each copies a
    slice of ``b`` only: ``a.startswith(piece, pos)`` compares in place), from ``hint`` if the
    first ``hint`` characters agree."""
    n = min(len(a) - i, len(b) - j)
    if n <= 0:
        return 0
    k = 0
    step = 64
    if 0 < hint <= n and a.startswith(b[j:j + hint], i):
        k = hint
        step = max(step, hint // 4)
    while k < n:
        m = min(step, n - k)
        if not a.startswith(b[j + k:j + k + m], i + k):
            lo, hi = k, k + m
            while hi - lo > 8:
                mid = (lo + hi) // 2
                if a.startswith(b[j + lo:j + mid], i + lo):
                    lo = mid
                else:
                    hi = mid
            while lo < hi and a[i + lo] == b[j + lo]:
                lo += 1
            return lo
        k += m
        step *= 2
    return n


def _common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the common suffix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    k = 0
    step = 64
    la, lb = len(a), len(b)
    while k < n:
        m = min(step, n - k)
        if a[la - k - m:la - k] != b[lb - k - m:lb - k]:
            lo, hi = k, k + m  # the last lo characters agree, the last hi do not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a[la - mid:la - lo] == b[lb - mid:lb - lo]:
                    lo = mid
                else:
                    hi = mid
            return lo
        k += m
        step *= 2
    return n


def _realign(text: str, old: str, c: int, delta: int) -> tuple[int, int] | None:
    """Where the two texts agree again after they differ at ``c`` (new text; ``c + delta`` in
    ``old``): the next line, a later line found shortly after in ``old``, or their common end.
    A guess: the splice copies only what it then finds equal."""
    co = c + delta
    nt = text.find("\n", c)
    no = old.find("\n", co)
    if nt >= 0 and no >= 0:
        m = min(32, len(text) - nt, len(old) - no)
        if m >= 16 and text[nt:nt + m] == old[no:no + m]:
            return nt, no
    p = nt
    for _ in range(8):
        if p < 0:
            break
        probe = text[p:p + 48]
        if len(probe) >= 24:
            f = old.find(probe, co, co + 16384)
            if f >= 0:
                return p, f
        p = text.find("\n", p + 1)
    s = _common_suffix(text, old, min(len(text) - c, len(old) - co))
    if s >= _MIN_REUSE:
        return len(text) - s, len(old) - s
    return None


# -- the cache ---------------------------------------------------------------------------------

def _grid(n: int) -> list[int]:
    """The grid points (prefix lengths in bytes) of a text of ``n`` bytes."""
    points = [g for g in _GRID if g <= n]
    if len(points) == len(_GRID):
        points += range(_GRID[-1] + _GRID_STEP, n + 1, _GRID_STEP)
    return points


def _digests(data: bytes) -> list[int]:
    """The xxh3 digests of ``data``'s prefixes at the grid points (hashing the prefixes one by
    one is cheaper than a streaming hasher's Python calls); the whole text is hashed with
    seed 1, kept apart."""
    view = memoryview(data)
    digest = xxhash.xxh3_64_intdigest
    return [digest(view[:g]) for g in _grid(len(data))]


class _PrefixIndex:
    """LRU of encodings bounded by their tokens, indexed by prefix digests (module docstring)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.tokens = 0
        self._lru: OrderedDict[Encoded, None] = OrderedDict()
        self._prefix: dict[int, Encoded] = {}
        self._whole: dict[int, Encoded] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def exact(self, whole: int, text: str) -> Encoded | None:
        enc = self._whole.get(whole)
        if enc is None or enc.text != text:
            return None
        self._lru.move_to_end(enc)
        return enc

    def base(self, data: bytes) -> tuple[Encoded, int] | None:
        """The entry under the deepest matching prefix digest of ``data``, and that prefix's
        length (digests computed from the deepest down, up to the first hit)."""
        get = self._prefix.get
        view = memoryview(data)
        digest = xxhash.xxh3_64_intdigest
        for g in reversed(_grid(len(data))):
            enc = get(digest(view[:g]))
            if enc is not None:
                self._lru.move_to_end(enc)
                return enc, g
        return None

    def add(self, enc: Encoded, digests: list[int], whole: int) -> None:
        size = len(enc.ids) + 1
        if size > self.budget:
            return
        prefix = self._prefix
        # The newest entry owns a digest: a conversation's next turn finds the turn before it
        # (the longest text it extends), not the first turn that reached that grid point.
        prefix.update(dict.fromkeys(digests, enc))
        self._whole[whole] = enc
        enc._keys = [*digests, ~whole]
        self._lru[enc] = None
        self.tokens += size
        while self.tokens > self.budget:
            old, _ = self._lru.popitem(last=False)
            self.tokens -= len(old.ids) + 1
            for d in old._keys:
                table, key = (self._whole, ~d) if d < 0 else (prefix, d)
                if table.get(key) is old:
                    del table[key]
