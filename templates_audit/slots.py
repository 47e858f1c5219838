"""The kind of a template slot, judged on all the values it took, not on one diff.

``classify`` names one varying span from its text and context. Some kinds only show across
requests (issue 19):

* **variant** — a slot of kind ``other`` or ``name`` with at most :data:`VARIANT_MAX` distinct
  values over at least :data:`VARIANT_REQUESTS` requests per value (a reply language, a plan
  name): each value is its own cached prefix, so it is not a per-request breaker;
* **version** — a slot of kind ``other``, ``name``, ``numeric_id`` or ``hex_id`` with at most
  :data:`VARIANT_MAX` distinct values, each holding a digit, that follow one another in trace
  order (each value's requests in one run: ``switches`` < distinct values): a prompt tag or a
  build number that changed with a deploy (``[notes-prompt v3.4.1]`` then ``v3.4.2``,
  ``assistant-prompt@4.11.0-rc.1``, ``model-2025-04``), where a variant's values interleave;
* **name** — an ``other`` slot whose distinct values are mostly shaped like names
  (:func:`.detectors.shapes.name_shaped`, in any script, on the part of each value that differs
  from the reference's: ``お客様は田中 健様です`` counts ``田中 健``; :data:`NAME_SHARE`) and more than
  :data:`VARIANT_MAX` of them: a person's name with no cue ("Maëlle van der Berg has contacted
  us before");
* **sampled_block** — a multi-line ``other`` slot whose values are drawn from a small pool of
  lines (at most :data:`POOL_MAX` distinct lines, each seen :data:`POOL_REPEATS` times on
  average, over at least :data:`POOL_VALUES` distinct values): few-shot examples picked and
  ordered per request. Fixing the set and order makes the block itself cacheable.

Pure functions of a span's accumulated statistics (:class:`.state.SpanStats`); O(1).
"""

from __future__ import annotations

import re

from templates_audit.detectors import Kind
from templates_audit.findings import common_prefix, common_suffix

__all__ = ["POOL_MAX", "slot_kind", "value_core", "value_lines"]

VARIANT_MAX = 4
VARIANT_REQUESTS = 5
NAME_SHARE = 0.8
POOL_MAX = 64
POOL_REPEATS = 2.0
POOL_VALUES = 3
_PIECES = re.compile(r"\n| … ")
_PLAIN = frozenset({Kind.OTHER.value, Kind.NAME.value})
_RELEASED = _PLAIN | {Kind.NUMERIC_ID.value, Kind.HEX_ID.value}


def _cased_inside(text: str, i: int) -> bool:
    """Whether position ``i`` falls inside a word of a cased script (a cut there splits it)."""
    return 0 < i < len(text) and text[i - 1].isalnum() and text[i].isalnum() and not (
        text[i - 1].isalpha() and not text[i - 1].isupper() and not text[i - 1].islower())


def value_core(value: str, ref: str) -> str:
    """``value`` without the characters it shares with ``ref`` at both ends, cut at word
    boundaries (in a caseless script any character boundary is one): the part of a slot value
    that varies when the diff widened it to a whole run of CJK text. Cost: two C-speed
    common-affix searches."""
    p = common_prefix(value, ref)
    s = common_suffix(value, ref, min(len(value), len(ref)) - p)
    while p > 0 and _cased_inside(value, p):
        p -= 1
    while s > 0 and _cased_inside(value, len(value) - s):
        s -= 1
    return value[p:len(value) - s].strip()


def value_lines(value: str) -> list[str]:
    """The non-empty lines of a block value (pieces of one request joined by `` … `` too)."""
    return [ln for ln in (p.strip() for p in _PIECES.split(value)) if ln]


# A name-shaped slot is no person's name when its context names a place or a thing: "at the
# Calmouth station desk", "Build codename: Amber Gecko", "Region: Glenvik" (data, not code).
_THING_BEFORE = re.compile(
    r"(?:\b(?:at|in|from|near|to) the|\b(?:code ?name|project|release|region|city|town|station"
    r"|branch|office|depot|site|store|warehouse|location|country|team|product|plan|tier|venue"
    r"|airport|campus|district|area)s?)[ \t]*[:=]?[ \t]*$", re.IGNORECASE)
_THING_AFTER = re.compile(
    r"^[ \t]*(?:station|branch|office|depot|region|store|warehouse|site|city|town|airport|campus"
    r"|team|project|release|district|area|venue|hotel|clinic|hospital|line)\b", re.IGNORECASE)


def thing_context(before: str, after: str) -> bool:
    """Whether the text around a slot says it holds a place or a thing, not a person."""
    return bool(_THING_BEFORE.search(before[-48:]) or _THING_AFTER.match(after[:48]))


def slot_kind(kind: str, *, distinct: int, capped: bool, requests: int, multi_line: bool,
              name_like: int, pool: int, pool_full: bool, pool_lines: int,
              switches: int = 0, digit_values: int = 0, thing: bool = False) -> str:
    """The report kind of a slot whose spans were classified ``kind`` (see the module
    docstring); ``requests``: the template's; ``switches``: how often its value changed from
    one of the template's requests to the next; ``digit_values``: distinct values holding a
    digit; ``thing``: the context names a place or a thing (:func:`thing_context`), so
    name-shaped values stay ``other``."""
    if (kind in _RELEASED and not multi_line and not capped and 1 < distinct <= VARIANT_MAX
            and digit_values == distinct and switches < distinct
            and requests >= VARIANT_REQUESTS * distinct):
        return Kind.VERSION.value
    if kind not in _PLAIN:
        return kind
    if multi_line:
        if (kind == Kind.OTHER.value and not pool_full and distinct >= POOL_VALUES
                and 0 < pool <= POOL_MAX and pool_lines >= POOL_REPEATS * pool):
            return Kind.SAMPLED_BLOCK.value
        return kind
    if not capped and distinct <= VARIANT_MAX and requests >= VARIANT_REQUESTS * distinct:
        return Kind.VARIANT.value
    if (kind == Kind.OTHER.value and distinct > VARIANT_MAX and name_like >= NAME_SHARE * distinct
            and not thing):
        return Kind.NAME.value
    return kind
