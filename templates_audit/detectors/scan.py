"""`scan` (all volatile values in a text) and `first_volatile` (the router's cut-off point).

Algorithm:
1. every detector's patterns run over the text; a candidate is dropped if the character before
   it is in the detector's `reject_after` class or its validator says no;
2. overlaps are resolved greedily, longest candidate first (ties: detector priority, then
   position), so the result is non-overlapping and the most complete reading wins
   (`2023-04-20 06:52:11Z` beats `2023-04-20` and `06:52:11Z`);
3. runs of adjacent dates, weekdays and times separated only by a joiner (space, comma, `at`,
   `on`, `-`) merge: with a date and a time into one `timestamp` (`08:32PM Monday, May 13,
   2024`, `Wed, 07 Dec 2022 22:50:56 +0000`), a weekday and a date into one `date`. Anchor-only
   candidates (a lone weekday, `7 PM`, `3:16`) that merged with nothing are dropped;
4. a date is re-labelled by its left context: after "knowledge cutoff"/"last updated" it
   becomes `knowledge_cutoff`, introduced as a fixed event ("founded on") `event_date`. These
   are long-lived (`Match.long_lived`): the router does not cut there. Values after "e.g." are
   NOT exempt: templates fill examples with live values too ("e.g. "yesterday" is Monday,
   July 6, 2026"), and cutting early only shortens the routing key, while missing a volatile
   value changes the key with every request.

Invariants: the result is sorted by start, spans never overlap, `text[m.start:m.end] == m.value`,
and `scan(text, kinds)` is exactly `scan(text)` restricted to `kinds`.

Cost: one linear regex pass per pattern (each starts with a literal or character class, so `re`
only tries positions where a value can begin) plus O(k^2) for k candidates, k being small.
`first_volatile` runs the same pipeline without the name detector (names hold no digits, so
they never overlap a router-kind value) and is memoised for the most recent texts.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from functools import lru_cache

from . import heuristics as h
from .kinds import EVENT_DATE, KNOWLEDGE_CUTOFF, LONG_LIVED_DETECTORS, Kind, Match
from .patterns import ROUTER_DETECTORS, TEXT_WIDE, WINDOWED, Detector
from .regions import LONG_TOKEN_RUN, Window, windows

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


def _candidates(
    text: str, detectors: Iterable[Detector], window: Window | None = None
) -> list[_Cand]:
    """Validated candidates of `detectors` inside `window` (default: the whole text)."""
    lo, hi, longest = window or (0, len(text), LONG_TOKEN_RUN)
    region = text[lo:hi] if window else text
    out: list[_Cand] = []
    for det in detectors:
        if longest < det.min_run or (det.token and longest < LONG_TOKEN_RUN):
            continue
        if det.gate:
            for g in det.gate:  # a plain loop: no generator per detector (this runs per line)
                if g in region:
                    break
            else:
                continue
        left = det.reject_after
        validate = det.validate
        for pattern in det.patterns:
            for m in pattern.finditer(text, lo, hi):
                start, end = h.span(m)
                if left is not None and start > 0 and left.match(text, start - 1):
                    continue
                if validate is None or validate(m, text):
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
    dates = [c for c in group if c[2].kind is Kind.DATE and not c[2].anchor]
    has_time = any(c[2].kind is Kind.TIME for c in group)
    if dates and (has_time or len(group) > 1):
        start, end = group[0][0], group[-1][1]
        kind, name = (Kind.TIMESTAMP, "datetime") if has_time else (Kind.DATE, dates[0][2].name)
        out.append(Match(kind, start, end, text[start:end], name))
        return
    for start, end, det in group:
        if not det.anchor:
            out.append(Match(det.kind, start, end, text[start:end], det.name))


def _merge(text: str, taken: list[_Cand]) -> list[Match]:
    out: list[Match] = []
    group: list[_Cand] = []
    for cand in taken:
        if group:
            gap_start = group[-1][1]
            joined = cand[0] - gap_start <= _MAX_JOIN and _JOIN.fullmatch(text, gap_start, cand[0])
            if not (joined and _mergeable(cand)):
                _emit(text, group, out)
                group = []
        if _mergeable(cand):
            group.append(cand)
        elif not cand[2].anchor:
            start, end, det = cand
            out.append(Match(det.kind, start, end, text[start:end], det.name))
    _emit(text, group, out)
    return out


def _relabel(text: str, m: Match) -> Match:
    if m.long_lived or m.kind not in (Kind.DATE, Kind.TIMESTAMP):
        return m
    name = None
    if h.in_release_context(text, m.start):
        name = KNOWLEDGE_CUTOFF
    elif h.in_event_context(text, m.start):
        name = EVENT_DATE
    return m if name is None else Match(m.kind, m.start, m.end, m.value, name)


def _finish(text: str, cands: list[_Cand]) -> list[Match]:
    return [_relabel(text, m) for m in _merge(text, _resolve(cands))]


def scan(text: str, kinds: Collection[Kind] | None = None) -> list[Match]:
    """All detected values, sorted by start, non-overlapping; optionally only those of `kinds`."""
    cands = _candidates(text, TEXT_WIDE)
    for window in windows(text, dotted=True):
        cands += _candidates(text, WINDOWED, window)
    found = _finish(text, cands)
    if kinds is None:
        return found
    return [m for m in found if m.kind in kinds]


@lru_cache(maxsize=256)
def first_volatile(text: str) -> Match | None:
    """The earliest per-request/per-day/per-session value (a `ROUTER_KINDS` match that is not
    long-lived), or None: the router's routing key is the text before `match.start`.

    Only the windows around seed digit runs (and `eyJ`, for JWTs) are scanned, in order, and
    the scan stops at the first window holding such a value. Memoised: a router sees the same
    system prompt many times."""
    for window in windows(text, dotted=False, extra=("eyJ",)):
        for m in _finish(text, _candidates(text, ROUTER_DETECTORS, window)):
            if m.kind in ROUTER_KINDS and not m.long_lived:
                return m
    return None
