"""The kind of a template slot, judged on all the values it took, not on one diff.

``classify`` names one varying span from its text and context. Some kinds only show across
requests (issue 19):

* **variant** — a slot of kind ``other`` or ``name`` with at most :data:`VARIANT_MAX` distinct
  values over at least :data:`VARIANT_REQUESTS` requests per value (a reply language, a plan
  name): each value is its own cached prefix, so it is not a per-request breaker;
* **name** — an ``other`` slot whose distinct values are mostly capitalised one-to-three-word
  names (:data:`NAME_SHARE`; a diff may keep only the surname) and more than :data:`VARIANT_MAX` of them: a person's name with no
  cue ("You are talking with Maria Gonzalez");
* **sampled_block** — a multi-line ``other`` slot whose values are drawn from a small pool of
  lines (at most :data:`POOL_MAX` distinct lines, each seen :data:`POOL_REPEATS` times on
  average, over at least :data:`POOL_VALUES` distinct values): few-shot examples picked and
  ordered per request. Fixing the set and order makes the block itself cacheable.

Pure functions of a span's accumulated statistics (:class:`.state.SpanStats`); O(1).
"""

from __future__ import annotations

import re

from templates_audit.detectors import Kind

__all__ = ["NAME_SHAPE", "POOL_MAX", "slot_kind", "value_lines"]

VARIANT_MAX = 4
VARIANT_REQUESTS = 5
NAME_SHARE = 0.8
POOL_MAX = 64
POOL_REPEATS = 2.0
POOL_VALUES = 3
NAME_SHAPE = re.compile(r"[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)?(?: [A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)?){0,2}")
_PIECES = re.compile(r"\n| … ")
_PLAIN = frozenset({Kind.OTHER.value, Kind.NAME.value})


def value_lines(value: str) -> list[str]:
    """The non-empty lines of a block value (pieces of one request joined by `` … `` too)."""
    return [ln for ln in (p.strip() for p in _PIECES.split(value)) if ln]


def slot_kind(kind: str, *, distinct: int, capped: bool, requests: int, multi_line: bool,
              name_like: int, pool: int, pool_full: bool, pool_lines: int) -> str:
    """The report kind of a slot whose spans were classified ``kind`` (see the module
    docstring); ``requests``: the template's requests."""
    if kind not in _PLAIN:
        return kind
    if multi_line:
        if (kind == Kind.OTHER.value and not pool_full and distinct >= POOL_VALUES
                and 0 < pool <= POOL_MAX and pool_lines >= POOL_REPEATS * pool):
            return Kind.SAMPLED_BLOCK.value
        return kind
    if not capped and distinct <= VARIANT_MAX and requests >= VARIANT_REQUESTS * distinct:
        return Kind.VARIANT.value
    if kind == Kind.OTHER.value and distinct > VARIANT_MAX and name_like >= NAME_SHARE * distinct:
        return Kind.NAME.value
    return kind
