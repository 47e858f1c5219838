"""`scan` (all volatile values in a text) and `first_volatile` (the router's cut-off point).

Algorithm:
1. every detector's patterns run over the text; candidates failing their validator are dropped;
2. overlaps are resolved greedily, longest candidate first (ties: detector priority, then
   position), so the result is non-overlapping and the most complete reading wins
   (`2023-04-20 06:52:11Z` beats `2023-04-20` and `06:52:11Z`);
3. adjacent dates, weekdays and times separated only by a joiner (space, comma, `at`, `on`, `T`)
   merge into one `timestamp` (`08:32PM Monday, May 13, 2024`); anchor-only candidates (a lone
   weekday, `7 PM`, `3:16`) that did not merge are dropped;
4. a date whose left context in the same sentence says "knowledge cutoff"/"last updated" is
   re-labelled with detector `knowledge_cutoff` (long-lived, see `Match.long_lived`).

Invariants: the result is sorted by start, spans never overlap, `text[m.start:m.end] == m.value`,
and `scan(text, kinds)` is exactly `scan(text)` restricted to `kinds`.

Cost: one linear regex pass per pattern plus O(k log k) for k candidates. `first_volatile`
skips the pattern passes that cannot matter: if the text has no digit (every router-kind value
but a few secrets contains one) only the secret patterns run.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from . import heuristics as h
from .kinds import KNOWLEDGE_CUTOFF, LONG_LIVED_DETECTORS, Kind, Match
from .patterns import DETECTORS, Detector

ROUTER_KINDS: frozenset[Kind] = frozenset(
    {
        Kind.TIMESTAMP,
        Kind.DATE,
        Kind.TIME,
        Kind.UUID,
        Kind.HEX_ID,
        Kind.NUMERIC_ID,
        Kind.SECRET,
    }
)

_Cand = tuple[int, int, Detector]
_JOIN = re.compile(r"T|[\s,]*(?:(?:at|on|@|-|–)[\s,]*)?")
_MAX_JOIN = 8


def _candidates(text: str, detectors: Iterable[Detector]) -> list[_Cand]:
    out: list[_Cand] = []
    for det in detectors:
        for pattern in det.patterns:
            for m in pattern.finditer(text):
                if det.validate is None or det.validate(m, text):
                    start, end = h.span(m)
                    out.append((start, end, det))
    return out


def _resolve(cands: list[_Cand]) -> list[_Cand]:
    """Greedy longest-first selection of non-overlapping candidates, returned sorted by start."""
    cands.sort(key=lambda c: (c[0] - c[1], c[2].priority, c[0]))
    taken: list[_Cand] = []
    for cand in cands:
        start, end, _ = cand
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append(cand)
    taken.sort(key=lambda c: c[0])
    return taken


def _mergeable(cand: _Cand) -> bool:
    det = cand[2]
    return det.kind in (Kind.DATE, Kind.TIME) and det.name not in LONG_LIVED_DETECTORS


def _emit(text: str, group: list[_Cand], out: list[Match]) -> None:
    has_date = any(c[2].kind is Kind.DATE and not c[2].anchor for c in group)
    has_time = any(c[2].kind is Kind.TIME for c in group)
    if has_date and has_time:
        start, end = group[0][0], group[-1][1]
        out.append(Match(Kind.TIMESTAMP, start, end, text[start:end], "datetime"))
        return
    for start, end, det in group:
        if not det.anchor:
            out.append(Match(det.kind, start, end, text[start:end], det.name))


def _merge(text: str, taken: list[_Cand]) -> list[Match]:
    out: list[Match] = []
    group: list[_Cand] = []
    for cand in taken:
        if not _mergeable(cand):
            _emit(text, group, out)
            group = []
            start, end, det = cand
            if not det.anchor:
                out.append(Match(det.kind, start, end, text[start:end], det.name))
            continue
        if group:
            gap_start = group[-1][1]
            if cand[0] - gap_start > _MAX_JOIN or not _JOIN.fullmatch(text, gap_start, cand[0]):
                _emit(text, group, out)
                group = []
        group.append(cand)
    _emit(text, group, out)
    return out


def _tag_long_lived(text: str, m: Match) -> Match:
    if m.kind in (Kind.DATE, Kind.TIMESTAMP) and not m.long_lived:
        if h.in_release_context(text, m.start):
            return Match(m.kind, m.start, m.end, m.value, KNOWLEDGE_CUTOFF)
    return m


def _scan(text: str, detectors: Iterable[Detector]) -> list[Match]:
    taken = _resolve(_candidates(text, detectors))
    return [_tag_long_lived(text, m) for m in _merge(text, taken)]


_HAS_DIGIT = re.compile(r"\d")
_DIGITLESS = tuple(d for d in DETECTORS if d.kind is Kind.SECRET)


def scan(text: str, kinds: Collection[Kind] | None = None) -> list[Match]:
    """All detected values, sorted by start, non-overlapping; optionally only those of `kinds`."""
    found = _scan(text, DETECTORS)
    if kinds is None:
        return found
    return [m for m in found if m.kind in kinds]


def first_volatile(text: str) -> Match | None:
    """The earliest per-request/per-day/per-session value (a `ROUTER_KINDS` match that is not
    long-lived), or None: the router's routing key is the text before `match.start`."""
    detectors = DETECTORS if _HAS_DIGIT.search(text) else _DIGITLESS
    for m in _scan(text, detectors):
        if m.kind in ROUTER_KINDS and not m.long_lived:
            return m
    return None
