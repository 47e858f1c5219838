"""Value shapes: does a varying run of text look like a person's name, or like an identifier?

The detectors find values by pattern and cue. A value that varies between requests but has
neither (``Maëlle van der Berg has contacted us before``, ``Employee no. E40522``,
``usr_4vg8898eta``) is recognised by its shape instead; the auditor then judges the slot on all
the values it took (:mod:`templates_audit.slots`).

* :func:`name_shaped` — one to four words of letters in any script: capitalised words (``Zoë``,
  ``Ó Briain``, ``O'Connor``, ``Anne-Marie``, ``Thị``), lowercase name particles between them
  (``van der``, ``de``, ``bin``), or short words of a caseless script (``山田 太郎``, ``김민준``).
  Words that are all capitals (``EMEA``), stop words (``The``, ``Monday``) and words holding
  digits are not names.
* :func:`id_shaped` — one token of letters, digits and ``_-#:/.`` mixing in letters or
  separators, with a segment (between separators) of three or more digits or of ten or more
  characters mixing letters and digits (``E40522``, ``OD-227-568-Y``, ``cus_Qhf9ZHiE2ZpMc4``),
  or digit groups split by single spaces (``4412 0091 7730``). A model name
  (``llama-3.1-70b``, ``claude-sonnet-4``) is none: its numbers are short.

Pure functions, O(len(value)); standard library only (the router imports this package).
"""

from __future__ import annotations

import re

from .heuristics import NOT_NAMES

__all__ = ["id_shaped", "name_shaped"]

MAX_NAME_WORDS = 4
MAX_CASELESS_CHARS = 5  # characters of one word of a caseless script (a CJK given name is 1-3)
NAME_PARTICLES = frozenset(
    "van von der den de del della dei di da das dos du le la les zu ter ten af av bin ibn al el "
    "y e st".split()
)
_JOIN = re.compile(r"[-'’]")
_ID = re.compile(r"#?[A-Za-z0-9][A-Za-z0-9_#:/.-]{2,63}")
_SEGMENTS = re.compile(r"[_#:/.-]+")
_DIGIT_GROUPS = re.compile(r"\d{2,6}(?: \d{2,6}){1,5}")


def _caseless(word: str) -> bool:
    """A word of a script without letter case (CJK ideographs, kana, hangul...)."""
    return all(c.isalpha() and not c.isupper() and not c.islower() for c in word)


def _name_word(word: str, first: bool) -> bool:
    if _caseless(word):
        return len(word) <= MAX_CASELESS_CHARS
    parts = _JOIN.split(word)
    if not all(p.isalpha() for p in parts) or (word.isupper() and len(word) > 1):
        return False
    head = parts[0]
    if head[:1].isupper():
        return not (first and word in NOT_NAMES)
    # `d'Arc`, `l'Ouverture`: an elided particle glued to a capitalised part
    return len(parts) > 1 and len(head) <= 2 and parts[1][:1].isupper()


def name_shaped(value: str) -> bool:
    """Whether ``value`` is shaped like a person's name (see the module docstring)."""
    words = value.split()
    if not 1 <= len(words) <= MAX_NAME_WORDS:
        return False
    for i, word in enumerate(words):
        inner = 0 < i < len(words) - 1
        if inner and word in NAME_PARTICLES:
            continue
        if not _name_word(word.rstrip(".,"), i == 0):
            return False
    return True


def id_shaped(token: str) -> bool:
    """Whether ``token`` is shaped like an identifier (see the module docstring)."""
    if _DIGIT_GROUPS.fullmatch(token):
        return True
    if not _ID.fullmatch(token) or token.isdigit():  # a plain number: the numeric rules judge it
        return False
    for seg in _SEGMENTS.split(token):
        digits = sum(c.isdigit() for c in seg)
        if digits >= 3 or (digits and len(seg) >= 10 and digits < len(seg)):
            return True
    return False
