"""Where a Hugging Face ``tokenizer.json`` lets a text be re-tokenised from the middle, exactly.

``tokenizers`` encodes a text in stages: it cuts out the added tokens (leftmost-longest, on the
raw text), normalises each remaining *split*, pre-tokenises each split into *words*, and runs the
model on each word alone; the post-processor then edits offsets (and adds BOS/EOS on request).
:mod:`.incremental` reuses the tokens of a text it has already encoded up to a *restart point*
``b`` and encodes only ``text[b:]``. That is exact when, for the new text ``T``:

1. ``T`` is cut at ``b`` (no added token, normaliser window, word or merge spans ``b``),
2. the tokens before ``b`` are those of the old text (both agree up to the first changed
   character ``c``, far enough past ``b`` that nothing after ``c`` can move a cut before ``b``),
3. the stages after ``b`` see what they would see in the whole text (nothing looks behind a cut;
   per-split prefixes — ``ByteLevel(add_prefix_space)``, ``Metaspace`` prepend, a ``Prepend``
   normaliser — are added only where ``T`` has a split start).

:func:`analyse` reads the tokenizer's JSON once and decides which cuts it can prove, as a
*level*: 0 — none (full encodes only); 1 — cuts at added-token splits (chat markers); 2 — also
cuts inside a split, at the cuts of a pre-tokenizer it knows or, for a BPE model with no
pre-tokenizer, between two characters no merge joins. :meth:`Rules.need` then says, for a
candidate ``b`` in a text, how far the text must agree (``need <= c``) for the cut to hold —
a pure function of the text around ``b``:

* **added tokens**: ``b`` is safe unless some suffix of ``text[:b]`` is a proper prefix of an
  added token (then a longer match could run across ``b``: the text must agree ``lmax - 1`` chars
  on); ``rstrip``/``single_word`` tokens look one character past their end, ``lstrip`` tokens
  need a non-space before ``b``, ``single_word`` tokens must not start at ``b``;
* **normalisers** act per character or per grapheme (NFC/NFKC compose only onto non-ASCII
  characters): ``text[b]`` must be ASCII (``Precompiled``: ``text[b-1]`` too, not ``\\r\\n``);
  a multi-character ``Replace`` must not match across ``b``; ``Strip`` and regex ``Replace``
  stop at level 1;
* **GPT-style split regexes** (GPT-2, Llama 3, Qwen 2/3.5, GPT-4o/o200k, Tekken, DeepSeek V3:
  the alternatives of :data:`REGEX_ATOMS`): each alternative is a run of one character class,
  whitespace runs that may give back their last character, bounded digit groups and
  contractions. Every match reads at most up to the first non-whitespace character after its
  end plus two (a contraction probe), so the cuts up to ``q`` are fixed by ``text[:s(q)]``,
  ``s(q)`` = three characters from the first non-whitespace character at or after ``q``;
  ``k`` split stages compose ``s`` ``k`` times. No alternative looks behind (``^``, ``$``,
  ``\\b`` or a lookbehind anywhere -> not an atom), so the words from a cut on are those of
  ``text[b:]``;
* **Metaspace(split=True)**: a word starts at each space; **Whitespace/WhitespaceSplit**: at a
  change of character class — one character of context;
* **BPE without pre-tokenizer** (SentencePiece BPE: Llama 2, Mistral v0.x, Gemma; also
  ``Metaspace(split=False)`` and ``ByteLevel(use_regex=False)``): a merge can only join ``x|y``
  across ``b`` if some merge ``(l, r)`` ends in ``x`` and starts with ``y``. For ASCII pairs no
  merge joins (the table :attr:`Rules.forced`), every BPE run on the split cuts at ``b``, and BPE's
  rank-ordered merges on ``X + Y`` are then those of ``X`` and of ``Y`` (merges on either side
  never depend on the other) — so the split encodes as ``X`` then ``Y``. Not for Unigram
  (Viterbi over floating-point scores) or WordPiece (greedy, continuation prefixes).

Families that stay at level 0 (every encode is a full one): BPE with dropout, model types this
module does not know. Level 1: unknown pre-tokenizers or normalisers (Punctuation, Digits,
UnicodeScripts, Bert, Strip, regex Replace...), Unigram or WordPiece without word cuts, normalised
added tokens with a normaliser, ``single_word`` tokens with per-split prefixes. Truncation and
padding of the file are ignored (vLLM tokenises prompts untruncated).

Cost: :func:`analyse` is linear in the vocabulary and merges (only the no-pre-tokenizer BPE
family reads them); :meth:`Rules.need` is O(added-token length + a few characters).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KIND_FORCED",
    "KIND_SPLIT",
    "KIND_WORD",
    "LEVEL_FULL",
    "LEVEL_SPLITS",
    "LEVEL_WORDS",
    "REGEX_ATOMS",
    "WHITE_SPACE",
    "AddedTokens",
    "Rules",
    "analyse",
    "byte_level_char",
    "regex_atoms",
]

LEVEL_FULL, LEVEL_SPLITS, LEVEL_WORDS = 0, 1, 2
# Restart kinds: the first token of a split (text start, or after an added token); the first
# token of a word inside a split; a token start inside a word at a forced (never merged) pair.
KIND_SPLIT, KIND_WORD, KIND_FORCED = 0, 1, 2
NEVER = 1 << 62  # a need no text satisfies

# Unicode White_Space: what Rust's and Oniguruma's \s match (str.isspace also has \x1c-\x1f).
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                        "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

_CONTRACTIONS = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)",
                 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])")
_UPPER_RUN = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER_RUN = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_NOT_LOWER = r"((?=[\p{L}])([^a-z]))"
_NOT_UPPER = r"((?=[\p{L}])([^A-Z]))"
_PRE = r"[^\r\n\p{L}\p{N}]?"
# Alternatives of the split regexes in use (GPT-2's ByteLevel, Llama 3 / Tekken v1 / GLM,
# Qwen 2 / 3.5, o200k / GPT-4o, Tekken, DeepSeek V3). Each is a run of one character class (with
# at most one optional leading character and an optional contraction or newline run after it),
# a bounded digit group, a contraction, or a whitespace run that may give back its last
# character: all read at most two characters past the first non-whitespace character after the
# match (see the module docstring).
REGEX_ATOMS: frozenset[str] = frozenset({
    # GPT-2 (ByteLevel use_regex) and StarCoder
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
    r" ?\p{L}+", r" ?\p{N}+", r" ?[^\s\p{L}\p{N}]+", r"\s+(?!\S)", r"\s+",
    # Llama 3, Qwen 2, Tekken v1, GLM, Qwen 3.5
    *_CONTRACTIONS,
    _PRE + r"\p{L}+", r"\p{N}{1,3}", r"\p{N}", r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+",
    _PRE + r"[\p{L}\p{M}]+", r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*",
    # o200k / GPT-4o, Tekken
    *(_PRE + a + b + c for a, b in ((_UPPER_RUN + "*", _LOWER_RUN + "+"),
                                     (_UPPER_RUN + "+", _LOWER_RUN + "*"),
                                     (_NOT_LOWER + "*", _NOT_UPPER + "+"),
                                     (_NOT_LOWER + "+", _NOT_UPPER + "*"))
      for c in ("", *(x + "?" for x in _CONTRACTIONS))),
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    # DeepSeek V3 (three split stages)
    "[一-龥぀-ゟ゠-ヿ]+", r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+",
    r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+", r" ?[\p{P}\p{S}]+[\r\n]*",
})
# ByteLevel's built-in regex (use_regex=True), as tokenizers compiles it.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def regex_atoms(pattern: str) -> list[str] | None:
    """The top-level alternatives of a regex (``|`` outside groups and classes), None when it
    is malformed for this simple scan."""
    out: list[str] = []
    depth = 0
    in_class = False
    start = 0
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            if pattern.startswith("^]", i + 1) or pattern.startswith("]", i + 1):
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
        i += 1
    if depth or in_class:
        return None
    out.append(pattern[start:])
    return out


def byte_level_char(byte: int) -> str:
    """GPT-2's byte -> printable character map (``ByteLevel``'s alphabet)."""
    if 33 <= byte <= 126 or 161 <= byte <= 172 or 174 <= byte <= 255:
        return chr(byte)
    shifted = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return chr(256 + shifted.index(byte))


@dataclass(frozen=True)
class AddedTokens:
    """The added tokens ``tokenizers`` cuts out before normalising (see the module docstring).

    ``raw``: contents matched on the raw text (``normalized: false``), ``normalized``: those
    matched on each normalised split (the same text when there is no normaliser)."""

    ids: frozenset[int] = frozenset()
    raw_ids: frozenset[int] = frozenset()  # ids of the raw ones: a split starts after them
    raw: tuple[str, ...] = ()
    normalized: tuple[str, ...] = ()
    lstrip: frozenset[str] = frozenset()
    rstrip: frozenset[str] = frozenset()
    single_word: frozenset[str] = frozenset()
    lmax: int = 0
    first_chars: frozenset[str] = frozenset()
    prefixes: frozenset[str] = frozenset()  # proper prefixes of every content
    _raw_re: re.Pattern[str] | None = field(default=None, repr=False, compare=False)
    _norm_re: re.Pattern[str] | None = field(default=None, repr=False, compare=False)
    first_re: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_spec(cls, entries: Sequence[Mapping[str, Any]], skip_special: bool = False
                  ) -> AddedTokens:
        toks = [e for e in entries if e.get("content") and not (skip_special and e.get("special"))]
        raw = tuple(e["content"] for e in toks if not e.get("normalized"))
        norm = tuple(e["content"] for e in toks if e.get("normalized"))
        contents = raw + norm

        def alternation(items: tuple[str, ...]) -> re.Pattern[str] | None:
            if not items:
                return None
            # Longest first: at the leftmost position the first alternative that matches is
            # the longest, as daachorse's LeftmostLongest finds it.
            return re.compile("|".join(re.escape(s) for s in sorted(set(items), key=len,
                                                                     reverse=True)))

        return cls(
            ids=frozenset(int(e["id"]) for e in toks),
            raw_ids=frozenset(int(e["id"]) for e in toks if not e.get("normalized")),
            raw=raw, normalized=norm,
            lstrip=frozenset(e["content"] for e in toks if e.get("lstrip")),
            rstrip=frozenset(e["content"] for e in toks if e.get("rstrip")),
            single_word=frozenset(e["content"] for e in toks if e.get("single_word")),
            lmax=max(map(len, contents), default=0),
            first_chars=frozenset(s[0] for s in contents),
            prefixes=frozenset(s[:k] for s in contents for k in range(1, len(s))),
            _raw_re=alternation(raw), _norm_re=alternation(norm),
            first_re=re.compile("[" + "".join(re.escape(c) for c in sorted({s[0] for s in contents}))
                                + "]") if contents else None,
        )

    def spans(self, text: str, b: int) -> bool:
        """Some suffix of ``text[:b]`` is a proper prefix of an added token: a match could
        start before ``b`` and run past it, depending on what follows."""
        if self.lmax < 2 or self.first_re is None:
            return False
        search = self.first_re.search
        m = search(text, max(0, b - self.lmax + 1), b)
        while m is not None:
            if text[m.start():b] in self.prefixes:
                return True
            m = search(text, m.start() + 1, b)
        return False

    def next_split(self, text: str, start: int, end: int) -> tuple[int, int] | None:
        """The first added-token split starting at or after ``start`` in ``text[:end]``:
        (start, end), with the whitespace a stripping token takes on each side (down to
        ``start`` on the left). ``single_word`` acceptance is not decided here."""
        best: int | None = None
        token = ""
        for pattern in (self._raw_re, self._norm_re):
            if pattern is None:
                continue
            m = pattern.search(text, start, end if best is None else best + len(token))
            if m is not None and (best is None or m.start() < best):
                best, token = m.start(), m.group()
        if best is None:
            return None
        stop = best + len(token)
        if token in self.lstrip:
            while best > start and text[best - 1] in WHITE_SPACE:
                best -= 1
        if token in self.rstrip:
            while stop < len(text) and text[stop] in WHITE_SPACE:
                stop += 1
        return best, stop

    def first_split(self, text: str, start: int, end: int) -> int | None:
        """Where the first added-token split at or after ``start`` begins in ``text[:end]``."""
        found = self.next_split(text, start, end)
        return None if found is None else found[0]


@dataclass(frozen=True)
class Rules:
    """What :func:`analyse` proved about one tokenizer (see the module docstring)."""

    level: int
    family: str
    reason: str  # why the level is not higher ("" at level 2)
    added: AddedTokens
    head: dict[str, Any]  # tokenizer JSON for chunks from a split start (no post-processor)
    mid: dict[str, Any] | None = None  # ... for chunks inside a split (per-split prefixes off)
    prefixing: str = "none"  # "none" | "split" (every split gets a prefix) | "first" (text start)
    boundary: str = ""  # "regex" | "space" | "run" | "forced" | "" (level < 2)
    regex_stages: int = 0
    ascii_start: bool = False
    grapheme: bool = False
    literals: tuple[str, ...] = ()
    space_chars: frozenset[str] = frozenset()
    norm_ascii: tuple[str, ...] | None = None  # normalised form of each ASCII char (None: same)
    forced: bytes = b""  # 128 * 128: 1 where no merge joins the two ASCII characters
    trims: tuple[bool, ...] = ()  # ByteLevel/Roberta offset trims, in order (their add_prefix_space)
    prefix_ids: tuple[int, ...] = ()  # post-processor tokens around the text (add_special_tokens)
    suffix_ids: tuple[int, ...] = ()

    def need(self, text: str, b: int, kind: int) -> int:
        """How far ``text`` must agree with another text for a cut at ``b`` to hold in both;
        ``NEVER`` when ``b`` is no restart point of this kind."""
        if b <= 0:
            return 0
        added = self.added
        n = b
        if kind == KIND_SPLIT:
            if added.rstrip or added.single_word:
                n = b + 1
        else:
            if self.level < LEVEL_WORDS or b >= len(text):
                return NEVER
            ch = text[b]
            prev = text[b - 1]
            if kind == KIND_FORCED:
                if (self.boundary != "forced" or not (ch.isascii() and prev.isascii())
                        or not self.forced[ord(prev) * 128 + ord(ch)]):
                    return NEVER
            elif self.boundary == "space" and ch not in self.space_chars:
                return NEVER
            if self.ascii_start and not ch.isascii():
                return NEVER
            if self.grapheme and (not prev.isascii() or (prev == "\r" and ch == "\n")):
                return NEVER
            if added.lstrip and prev.isspace():
                return NEVER
            n = b + 1
            if added.single_word:
                if any(text.startswith(s, b) for s in added.single_word):
                    return NEVER
                n = b + max(map(len, added.single_word))
            for lit in self.literals:
                if text.find(lit, max(0, b - len(lit) + 1), b + len(lit) - 1) >= 0:
                    return NEVER
                if b + len(lit) - 1 > n:
                    n = b + len(lit) - 1
            if self.boundary == "regex":
                q = b
                for _ in range(self.regex_stages):
                    q = self._settle(text, q)
                q = self._split_end(text, b, q)
                if q > n:
                    n = q
        if added.lmax > 1 and added.spans(text, b) and b + added.lmax - 1 > n:
            n = b + added.lmax - 1
        return n

    def _split_end(self, text: str, b: int, q: int) -> int:
        """``q`` moved past any added token that may start in ``text[b:q]``: one that does
        ends the split there, and the regex then sees the end of its text instead of what
        follows (GPT-2's ``\\s+(?!\\S)`` keeps a trailing newline run whole)."""
        added = self.added
        if q >= NEVER or added.first_re is None:
            return q
        search = added.first_re.search
        m = search(text, b, q)
        while m is not None:
            q = max(q, m.start() + added.lmax)
            m = search(text, m.start() + 1, q)
        return q

    def _settle(self, text: str, q: int) -> int:
        """Three counted characters from the first non-whitespace one at or after ``q`` (see
        the module docstring). With a normaliser only ASCII characters whose normal form is
        known count, so the bound can only come out later than the exact one."""
        n = len(text)
        table = self.norm_ascii
        i = q
        if table is None:
            while i < n and text[i].isspace():
                i += 1
            return i + 3 if i + 3 <= n else NEVER
        while i < n:
            ch = text[i]
            if ch.isascii():
                form = table[ord(ch)]
                if len(form) == 1 and not form.isspace():
                    break
            i += 1
        counted = 0
        while i < n:
            ch = text[i]
            i += 1
            if ch.isascii() and table[ord(ch)]:
                counted += 1
                if counted == 3:
                    return i
        return NEVER


# -- analysis ------------------------------------------------------------------------------------

class _Unsupported(Exception):
    """A component this module cannot reason about, at the given highest level."""

    def __init__(self, level: int, why: str) -> None:
        super().__init__(why)
        self.level = level
        self.why = why


@dataclass
class _Norm:
    ascii_start: bool = False
    grapheme: bool = False
    literals: list[str] = field(default_factory=list)
    prefix: bool = False  # a Prepend: every split gets a prefix
    per_char_maps: bool = False  # maps characters (a table of ASCII forms is needed)


def _normalizer(spec: Mapping[str, Any] | None, out: _Norm, first: bool = True) -> dict | None:
    """Check one normaliser (recursing into sequences); return it with Prepend removed."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        parts = []
        for i, sub in enumerate(spec.get("normalizers") or ()):
            kept = _normalizer(sub, out, first and i == 0)
            if kept is not None:
                parts.append(kept)
        return {**spec, "normalizers": parts}
    if kind in ("NFC", "NFD", "NFKC", "NFKD", "StripAccents"):
        out.ascii_start = out.per_char_maps = True
        return dict(spec)
    if kind in ("Lowercase", "Nmt", "BertNormalizer", "ByteLevel"):
        out.ascii_start = out.ascii_start or kind == "BertNormalizer"
        out.per_char_maps = True
        return dict(spec)
    if kind == "Precompiled":
        out.ascii_start = out.grapheme = out.per_char_maps = True
        return dict(spec)
    if kind == "Prepend":
        out.prefix = True
        return None
    if kind == "Replace":
        pattern = spec.get("pattern") or {}
        lit = pattern.get("String")
        if not isinstance(lit, str) or not lit:
            raise _Unsupported(LEVEL_SPLITS, "a regex Replace normaliser")
        if len(lit) > 1:
            if not first:
                raise _Unsupported(LEVEL_SPLITS, "a multi-character Replace after another normaliser")
            out.literals.append(lit)
        out.per_char_maps = True
        return dict(spec)
    if kind == "Strip":
        raise _Unsupported(LEVEL_SPLITS, "a Strip normaliser")
    raise _Unsupported(LEVEL_SPLITS, f"normaliser {kind!r}")


@dataclass
class _Pre:
    boundary: str = ""
    regex_stages: int = 0
    space_chars: set[str] = field(default_factory=set)
    prefixing: str = "none"
    byte_level: bool = False  # the model sees GPT-2 byte characters
    metaspace: str | None = None  # the model sees spaces as this character


def _split_regex(spec: Mapping[str, Any]) -> str | None:
    pattern = spec.get("pattern") or {}
    regex = pattern.get("Regex")
    if not isinstance(regex, str) or spec.get("behavior") != "Isolated" or spec.get("invert"):
        return None
    atoms = regex_atoms(regex)
    if atoms is None or not all(a in REGEX_ATOMS for a in atoms):
        return None
    return regex


def _pre_tokenizer(spec: Mapping[str, Any] | None, out: _Pre) -> dict | None:
    """Check the pre-tokenizer; return its JSON for mid-split chunks (prefixes of the stages
    that see whole splits turned off), or None when that is the same."""
    if spec is None:
        return None
    stages = list(spec.get("pretokenizers") or ()) if spec.get("type") == "Sequence" else [spec]
    mid: list[dict[str, Any]] = [copy.deepcopy(dict(st)) for st in stages]
    changed = False
    splitting = False  # an earlier stage has cut the splits into words
    for i, st in enumerate(stages):
        kind = st.get("type")
        if kind == "ByteLevel":
            if st.get("add_prefix_space"):
                if not splitting:
                    out.prefixing = "split"
                    mid[i]["add_prefix_space"] = False
                    changed = True
            out.byte_level = True
            if st.get("use_regex", True):
                _words(out, "regex", splitting)
                out.regex_stages += 1
                splitting = True
        elif kind == "Metaspace":
            scheme = st.get("prepend_scheme", "always")
            if scheme == "first":
                out.prefixing = "first" if out.prefixing == "none" else out.prefixing
                mid[i]["prepend_scheme"] = "never"
                changed = True
            elif scheme == "always" and not splitting:
                out.prefixing = "split"
                mid[i]["prepend_scheme"] = "never"
                changed = True
            out.metaspace = st.get("replacement", "▁")
            if st.get("split", True):
                _words(out, "space", splitting)
                out.space_chars |= {" ", out.metaspace}
                splitting = True
        elif kind == "Split":
            if _split_regex(st) is None:
                raise _Unsupported(LEVEL_SPLITS, "a Split pre-tokenizer whose pattern is not a "
                                                 "known GPT-style regex")
            if out.boundary not in ("", "regex"):
                raise _Unsupported(LEVEL_SPLITS, "a regex Split after another word splitter")
            out.boundary = "regex"
            out.regex_stages += 1
            splitting = True
        elif kind in ("WhitespaceSplit", "Whitespace"):
            _words(out, "run", splitting)
            splitting = True
        else:
            raise _Unsupported(LEVEL_SPLITS, f"pre-tokenizer {kind!r}")
    if not changed:
        return None
    return mid[0] if spec.get("type") != "Sequence" else {**spec, "pretokenizers": mid}


def _words(out: _Pre, boundary: str, splitting: bool) -> None:
    if splitting and out.boundary != boundary:
        if {out.boundary, boundary} <= {"run", "space"}:  # both one-character cuts
            out.boundary = "run"
            return
        raise _Unsupported(LEVEL_SPLITS, f"{boundary} word cuts after {out.boundary} ones")
    out.boundary = boundary


def _forced_pairs(model: Mapping[str, Any], model_char: Callable[[int], str]) -> bytes:
    """128 * 128 bytes: 1 where no merge of ``model`` joins the model forms of two ASCII chars."""
    vocab = model.get("vocab") or {}
    joined: set[tuple[str, str]] = set()
    for merge in model.get("merges") or ():
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left and right:
            joined.add((left[-1], right[0]))
    forms = [model_char(c) for c in range(128)]
    table = bytearray(128 * 128)
    for a in range(128):
        fa = forms[a]
        if not fa or fa[-1] not in vocab:
            continue
        for b in range(128):
            fb = forms[b]
            if fb and fb[0] in vocab and (fa[-1], fb[0]) not in joined:
                table[a * 128 + b] = 1
    return bytes(table)


def _post(spec: Mapping[str, Any] | None, add_special_tokens: bool
          ) -> tuple[tuple[bool, ...], tuple[int, ...], tuple[int, ...]]:
    """Offset trims and, with ``add_special_tokens``, the tokens put around the text."""
    if spec is None:
        return (), (), ()
    procs = list(spec.get("processors") or ()) if spec.get("type") == "Sequence" else [spec]
    trims: list[bool] = []
    pre: list[int] = []
    post: list[int] = []
    for p in procs:
        kind = p.get("type")
        added = bool(pre or post)
        if kind in ("ByteLevel", "RobertaProcessing"):
            if p.get("trim_offsets", True):
                if added:
                    raise _Unsupported(LEVEL_FULL, "offset trimming after added special tokens")
                trims.append(bool(p.get("add_prefix_space", True)))
        if not add_special_tokens:
            continue
        if kind in ("BertProcessing", "RobertaProcessing"):
            pre.append(int(p["cls"][1]))
            post.append(int(p["sep"][1]))
        elif kind == "TemplateProcessing":
            specials = p.get("special_tokens") or {}
            side = pre
            for piece in p.get("single") or ():
                if "Sequence" in piece:
                    side = post
                elif "SpecialToken" in piece:
                    side.extend(int(i) for i in specials[piece["SpecialToken"]["id"]]["ids"])
        elif kind != "ByteLevel":
            raise _Unsupported(LEVEL_FULL, f"post-processor {kind!r} with special tokens added")
    return tuple(trims), tuple(pre), tuple(post)


def analyse(spec: Mapping[str, Any], *, add_special_tokens: bool = False,
            skip_special: bool = False,
            normalize: Callable[[Mapping[str, Any] | None, str], str] | None = None) -> Rules:
    """The :class:`Rules` of a tokenizer (its canonical ``tokenizer.json`` as a dict).

    ``normalize(normaliser_spec, char)`` applies a normaliser to one character (the encoder
    passes the ``tokenizers`` library's); it is needed for the ASCII table of per-character
    normalisers. ``skip_special``: the tokenizer's ``encode_special_tokens`` (special tokens are
    then ordinary text)."""
    head: dict[str, Any] = {**copy.deepcopy(dict(spec)), "post_processor": None,
                            "truncation": None, "padding": None}
    added = AddedTokens.from_spec(spec.get("added_tokens") or (), skip_special)
    model = spec.get("model") or {}
    mtype = model.get("type")

    def rules(level: int, family: str, reason: str, **kw: Any) -> Rules:
        return Rules(level=level, family=family, reason=reason, added=added, head=head, **kw)

    try:
        trims, pre_ids, post_ids = _post(spec.get("post_processor"), add_special_tokens)
    except _Unsupported as exc:
        return rules(LEVEL_FULL, str(mtype), exc.why)
    extras: dict[str, Any] = {"trims": trims, "prefix_ids": pre_ids, "suffix_ids": post_ids}
    if mtype not in ("BPE", "Unigram", "WordPiece", "WordLevel"):
        return rules(LEVEL_FULL, str(mtype), f"model {mtype!r}", **extras)
    if mtype == "BPE" and model.get("dropout") not in (None, 0, 0.0):
        return rules(LEVEL_FULL, "BPE with dropout", "BPE dropout (not deterministic)", **extras)

    norm = _Norm()
    pre = _Pre()
    level, reason = LEVEL_WORDS, ""
    mid_norm = mid_pre = None
    try:
        mid_norm = _normalizer(spec.get("normalizer"), norm)
        mid_pre = _pre_tokenizer(spec.get("pre_tokenizer"), pre)
    except _Unsupported as exc:
        level, reason = exc.level, exc.why
    if norm.prefix:
        pre.prefixing = "split"
    if spec.get("pre_tokenizer") is not None and level == LEVEL_WORDS and not pre.boundary:
        pre.boundary = "none"
    family = _family(mtype, spec, pre)
    no_words = level == LEVEL_WORDS and pre.boundary in ("", "none")
    if no_words:
        if mtype != "BPE" or model.get("ignore_merges") or model.get(
                "continuing_subword_prefix") or model.get("end_of_word_suffix"):
            level, reason = LEVEL_SPLITS, f"{mtype} without word cuts"
    if added.normalized and spec.get("normalizer") is not None:
        level, reason = min(level, LEVEL_SPLITS), reason or "normalised added tokens"
    if (added.normalized and pre.prefixing == "split") or (added.single_word and pre.prefixing == "split"):
        level, reason = min(level, LEVEL_SPLITS), reason or "per-split prefixes with " \
                                                            "normalised or single-word added tokens"
    if level < LEVEL_SPLITS:
        return rules(level, family, reason, **extras)

    mid = None
    if (spec.get("normalizer") is not None and norm.prefix) or mid_pre is not None:
        mid = {**head}
        if norm.prefix:
            mid["normalizer"] = mid_norm
        if mid_pre is not None:
            mid["pre_tokenizer"] = mid_pre
    norm_ascii: tuple[str, ...] | None = None
    if spec.get("normalizer") is not None and level == LEVEL_WORDS:
        if normalize is None:
            level, reason = LEVEL_SPLITS, "no normaliser to tabulate"
        else:
            norm_ascii = tuple(normalize(mid_norm, chr(c)) for c in range(128))
    forced = b""
    if level == LEVEL_WORDS and no_words and pre.metaspace is not None \
            and _drops(model, pre.metaspace):
        # the model drops the word marker before merging, so merges join the words on either
        # side of it (transformers 5's Metaspace LlamaTokenizer over a byte-level vocabulary:
        # "hello world" -> "he l low ..."): a marker forces no cut, no splice is provable
        return rules(LEVEL_FULL, family, f"the model drops the word marker "
                     f"{pre.metaspace!r} (not in its vocabulary), so merges cross words",
                     **extras)
    if level == LEVEL_WORDS and no_words:
        def model_char(c: int) -> str:
            form = norm_ascii[c] if norm_ascii is not None else chr(c)
            if pre.metaspace is not None:
                form = form.replace(" ", pre.metaspace)
            if pre.byte_level:
                form = "".join(byte_level_char(x) for x in form.encode("utf-8"))
            return form
        forced = _forced_pairs(model, model_char)
        pre.boundary = "forced"
    return Rules(
        level=level, family=family, reason=reason, added=added, head=head, mid=mid,
        prefixing=pre.prefixing, boundary=pre.boundary if level == LEVEL_WORDS else "",
        regex_stages=pre.regex_stages, ascii_start=norm.ascii_start, grapheme=norm.grapheme,
        literals=tuple(norm.literals), space_chars=frozenset(pre.space_chars),
        norm_ascii=norm_ascii, forced=forced, **extras)


def _drops(model: Mapping[str, Any], marker: str) -> bool:
    """True when a BPE ``model`` silently drops ``marker``: not in its vocabulary, no unknown
    token to stand for it, and no byte fallback that can spell it (``byte_fallback`` needs
    the ``<0xNN>`` tokens of its UTF-8 bytes, which a byte-level vocabulary lacks)."""
    vocab = model.get("vocab")
    if not isinstance(vocab, Mapping) or marker in vocab or model.get("unk_token") is not None:
        return False
    return not (model.get("byte_fallback")
                and all(f"<0x{b:02X}>" in vocab for b in marker.encode("utf-8")))


def _family(mtype: str, spec: Mapping[str, Any], pre: _Pre) -> str:
    if pre.boundary == "regex":
        return f"{mtype}, regex pre-tokenizer" + (" (byte-level)" if pre.byte_level else "")
    if pre.metaspace is not None:
        return f"{mtype}, Metaspace" + ("" if pre.boundary == "space" else " (no split)")
    if pre.boundary == "run":
        return f"{mtype}, whitespace pre-tokenizer"
    if spec.get("pre_tokenizer") is None:
        return f"{mtype}, no pre-tokenizer"
    return f"{mtype}, {(spec.get('pre_tokenizer') or {}).get('type')} pre-tokenizer"
