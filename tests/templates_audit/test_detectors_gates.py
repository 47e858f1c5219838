"""Detector gates (`Detector.gate`: one of these substrings must occur in the region;
`Detector.token`: the window holds a long token) are an optimisation only: scanning with them
equals scanning without. The month, weekday and name-cue gates are substrings of every match of
their detector's patterns (the others are context that the validators require)."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from templates_audit.detectors import first_volatile, scan
from templates_audit.detectors.patterns import DETECTORS, Detector

from .test_detectors import DETECTED, NOT_VOLATILE
from .test_detectors_windows import FRAGMENTS

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December", "Jan.", "Feb", "Mar.", "Apr", "Jun.", "Jul", "Aug.",
          "Sept.", "Sep", "Oct.", "Nov", "Dec."]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "Mon.",
            "Tues.", "Tue", "Wed.", "Thurs.", "Thur", "Thu.", "Fri", "Sat.", "Sun"]
CUES = ["My name is", "name is", "You are talking to", "you are speaking with", "You're chatting to",
        "you're talking with", "User is called", "user is named", "\nUser:", "\nCustomer:", "Name:",
        "\nUser name:", "Username:", "Hello", "Hi", "Hey", "Dear", "Alice", "Bruno Díaz", "Mary-Jane",
        "O'Brien", "\n", ",", "!", "7th of", "24", "2025", "1999", "13"]
MORE = [*FRAGMENTS, *MONTHS, *WEEKDAYS, *CUES]
SEPARATORS = [" ", "\n", ", ", ": ", "", "! ", " of "]

texts = st.lists(
    st.tuples(st.sampled_from(MORE), st.sampled_from(SEPARATORS)), min_size=1, max_size=30
).map(lambda parts: "".join(f + s for f, s in parts))

IN_MATCH = [d for d in DETECTORS if d.name in ("month_name_date", "month_year", "weekday", "name_cue")]
SCAN = importlib.import_module("templates_audit.detectors.scan")


def _ungated(dets: tuple[Detector, ...]) -> tuple[Detector, ...]:
    return tuple(dataclasses.replace(d, gate=(), token=False) for d in dets)


def _ungated_scan(text: str) -> tuple[list, object]:  # type: ignore[type-arg]
    """(scan, first_volatile) with every gate removed."""
    with mock.patch.multiple(SCAN, TEXT_WIDE=_ungated(SCAN.TEXT_WIDE),
                             WINDOWED=_ungated(SCAN.WINDOWED),
                             ROUTER_DETECTORS=_ungated(SCAN.ROUTER_DETECTORS)):
        return scan(text), first_volatile.__wrapped__(text)


def _gate_holds(det: Detector, text: str) -> bool:
    return all(any(g in m.group() for g in det.gate) for p in det.patterns for m in p.finditer(text))


def _corpus() -> list[str]:
    fixed = [t for t, *_ in DETECTED] + list(NOT_VOLATILE)
    pairs = [f"{a} {b} 2025" for a, b in itertools.product(CUES, MONTHS + WEEKDAYS)]
    return fixed + pairs + [f"{c} {n}, {d} {m} 7, 2024" for c, n, d, m in
                            zip(CUES, CUES[::-1], WEEKDAYS * 2, MONTHS * 2, strict=False)]


def test_every_match_of_a_gated_detector_holds_a_gate() -> None:
    for text in _corpus():
        for det in IN_MATCH:
            assert _gate_holds(det, text), (det.name, text)
        assert (scan(text), first_volatile.__wrapped__(text)) == _ungated_scan(text), text


@settings(max_examples=200, deadline=None)
@given(texts)
def test_gated_scan_equals_the_ungated_scan(text: str) -> None:
    for det in IN_MATCH:
        assert _gate_holds(det, text), det.name
    assert (scan(text), first_volatile.__wrapped__(text)) == _ungated_scan(text)
