"""The default tokenizer equals the implementation it replaced, on random and real-looking text.

``ReferenceTokenizer`` is the earlier ``DefaultTokenizer`` (ids and offsets computed together,
piece by piece), kept verbatim as the specification; the current one flattens cached per-line id
tuples. The piece and special-token patterns and the piece-id hash are imported: they did not
change. Token ids decide every block hash, so they must not change.
"""

from __future__ import annotations

import functools
import random

import pytest

from templates_audit.tokenize import (
    _NEWLINE_ID,
    _PIECE,
    _SPECIAL,
    MAX_PIECE_CHARS,
    DefaultTokenizer,
    _piece_id,
)

_PIECE_IDS: dict[str, int] = {}
_PIECE_IDS_MAX = 1 << 18


def _encode_plain(text: str, base: int, ids: list[int], offs: list[int]) -> None:
    # The piece pattern matches every character of a line (letters, digits, punctuation,
    # underscores, whitespace), so the pieces are contiguous and offsets are running lengths;
    # findall avoids a match object per piece. Piece ids are memoised: words repeat.
    cache = _PIECE_IDS
    if len(cache) > _PIECE_IDS_MAX:
        cache.clear()
    pos = base
    for piece in _PIECE.findall(text):
        n = len(piece)
        if n <= MAX_PIECE_CHARS:
            pid = cache.get(piece)
            if pid is None:
                pid = cache[piece] = _piece_id(piece)
            ids.append(pid)
            offs.append(pos)
        else:
            for i in range(0, n, MAX_PIECE_CHARS):
                ids.append(_piece_id(piece[i : i + MAX_PIECE_CHARS]))
                offs.append(pos + i)
        pos += n


@functools.lru_cache(maxsize=1 << 16)
def _encode_line(line: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Token ids and offsets of one line (no newline inside). Cached: prompts repeat lines."""
    ids: list[int] = []
    offs: list[int] = []
    if "<" not in line and "[" not in line:
        _encode_plain(line, 0, ids, offs)
        return tuple(ids), tuple(offs)
    pos = 0
    for m in _SPECIAL.finditer(line):
        if m.start() > pos:
            _encode_plain(line[pos : m.start()], pos, ids, offs)
        ids.append(_special_id(m.group()))
        offs.append(m.start())
        pos = m.end()
    if pos < len(line):
        _encode_plain(line[pos:], pos, ids, offs)
    return tuple(ids), tuple(offs)


@functools.lru_cache(maxsize=1 << 10)
def _special_id(tok: str) -> int:
    return _piece_id("\x00special:" + tok)


class ReferenceTokenizer:
    """Deterministic, dependency-free tokenizer (see the module docstring for how it approximates)."""

    name = "default"

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        lines = text.split("\n")
        last = len(lines) - 1
        nl = _NEWLINE_ID
        enc = _encode_line
        for i, line in enumerate(lines):
            if line:
                out.extend(enc(line)[0])
            if i != last:
                out.append(nl)
        return out

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        offs: list[int] = []
        pos = 0
        lines = text.split("\n")
        last = len(lines) - 1
        for i, line in enumerate(lines):
            if line:
                lids, loffs = _encode_line(line)
                ids.extend(lids)
                offs.extend([pos + o for o in loffs])
                pos += len(line)
            if i != last:
                ids.append(_NEWLINE_ID)
                offs.append(pos)
                pos += 1
        return ids, offs




ALPHABET = [*"abcXYZ  \t\n\n0123456789_-:.,!?<>[]|/éß日🎉\x1c\xa0", "<|im_start|>", "<|im_end|>",
            "[INST]", "[/INST]", "</s>", "<s>", "<|eot_id|>", "<start_of_turn>", "internationalization",
            "   ", "<|", "|>", "\u2028", "________", "!!!!!!!!", "1234567"]


@pytest.mark.parametrize("seed", range(4))
def test_random_text_tokenises_as_before(seed: int) -> None:
    rng = random.Random(seed)
    new, ref = DefaultTokenizer(), ReferenceTokenizer()
    for _ in range(1000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 80)))
        assert new.encode(text) == ref.encode(text)
        assert new.encode_with_offsets(text) == ref.encode_with_offsets(text)
        assert new.encode(text) == ref.encode(text)  # again: from the line cache


def test_a_chat_prompt_tokenises_as_before() -> None:
    rules = "\n".join(f"Rule {i}: when the customer asks about billing, cite section {i}."
                      for i in range(40))
    text = (f"<|im_start|>system\nYou are assistant #7.\nCurrent date: 2025-05-20\n{rules}"
            "<|im_end|>\n<|im_start|>user\nQuestion 5: my order 123456?<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert DefaultTokenizer().encode(text) == ReferenceTokenizer().encode(text)
    assert DefaultTokenizer().encode_with_offsets(text) == ReferenceTokenizer().encode_with_offsets(text)


def test_ascii_piece_pattern_equals_the_unicode_one_on_ascii() -> None:
    from templates_audit.tokenize import _PIECE_ASCII

    chars = [chr(i) for i in range(128) if chr(i) != "\n"]
    rng = random.Random(3)
    texts = [a + b + c for a in chars for b in ("", " ", "a", "1", "_", "!") for c in chars[::7]]
    texts += ["".join(rng.choice(chars) for _ in range(rng.randrange(40))) for _ in range(2000)]
    for text in texts:
        assert _PIECE_ASCII.findall(text) == _PIECE.findall(text)


def _digits_replaced(text: str, rng: random.Random) -> str:
    return "".join(str(rng.randrange(10)) if c in "0123456789" else c for c in text)


@pytest.mark.parametrize("seed", range(3))
def test_lines_differing_only_in_digits_tokenise_as_before(seed: int) -> None:
    """The shape path (a line assembled from the plan of an earlier line with the same
    characters but for its ASCII digits) gives the reference's ids, also for digits inside
    special tokens, non-ASCII lines and long digit runs; and it is the path taken."""
    from templates_audit import tokenize

    rng = random.Random(seed)
    alphabet = [*ALPHABET, "<|reserved_12|>", "<｜tool▁7｜>", "2025-05-20T12:34:56Z", " 00", "٣"]
    new, ref = DefaultTokenizer(), ReferenceTokenizer()
    planned = 0
    for _ in range(400):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))).replace("\n", "")
        if not any(c in "0123456789" for c in line):
            line += " 42"
        for _ in range(4):
            variant = _digits_replaced(line, rng)
            assert new.encode(variant) == ref.encode(variant), variant
        shape = line.encode("utf-8", "surrogatepass").translate(tokenize._SHAPE_TABLE)
        planned += bool(tokenize._SHAPES.get(shape))
    assert planned > 300  # most shapes were seen at least twice, so planned


def test_shape_memory_is_bounded_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from templates_audit import tokenize

    monkeypatch.setattr(tokenize, "_SHAPES_MAX_BYTES", 4096)
    monkeypatch.setattr(tokenize, "_SHAPES", {})
    monkeypatch.setattr(tokenize, "_shapes_bytes", 0)
    new, ref = DefaultTokenizer(), ReferenceTokenizer()
    for i in range(300):  # unique shapes (the letters differ), ~100 bytes each
        line = f"{'x' * (i % 50)} id {i} {'y' * (50 - i % 50)} {i * 7} z{i}"
        assert new.encode(line) == ref.encode(line)
        assert sum(map(len, tokenize._SHAPES)) <= 4096 + len(line)
