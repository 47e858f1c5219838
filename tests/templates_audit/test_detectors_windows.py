"""The seed windows (regions.py) are an optimisation only: scanning the windows must give
exactly what scanning the whole text with every detector gives."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from templates_audit.detectors import ROUTER_KINDS, first_volatile, scan
from templates_audit.detectors.patterns import DETECTORS
from templates_audit.detectors.regions import windows
from templates_audit.detectors.scan import _candidates, _finish

FRAGMENTS = [
    "You are a helpful assistant.", "Answer in section 3.", "Retry 10 times.", "1.", "(2)",
    "Python 3.11", "GPT-4o", "v2", "version 2.1.4", "requests==2.31.0", "$1,234,567",
    "2024-05-20", "2024/05/20", "05/20/2024", "20.05.2024", "December 01 2022",
    "Monday, Aug 18, 2025", "24 April 2025", "Tuesday,", "at", "on", "2024年8月21日",
    "22:50:56", "8:32 PM", "7 PM", "14:05 UTC", "3:16", "Atlantic/Reykjavik", "GMT+0000",
    "2023-04-20 06:52:11Z", "Wed, 07 Dec 2022 22:50:56 +0000", "[1745440358947]",
    "48193ee0-f52d-41cd-ac65-ee28766bc853", "3f2a9c1b7d4e5f60a1b2", "req_8f7e6d5c4b3a2910",
    "user 1234577", "order #88812345", "982734650012", "alice@example.com", "a1@b.io",
    "sk-proj-abc123DEF456ghi789JKL012mno", "Knowledge cutoff:", "2023-10", "August 2023",
    "The current year is", "2026", "founded in", "claude-sonnet-4-20250514", "#ffffff",
    "localhost:8080", "The user's name is Alice.", "x" * 70, "word " * 15, "@x.io",
    "OS Version: Darwin", "24.6.0", "last updated on", "It is currently", "June",
    "deadbeef-dead-beef-dead-beefdeadbeef", "call_ab12cd34ef56gh78", "0x3f2a9c1b7d4e5f60a1",
]  # fmt: skip
SEPARATORS = [" ", "\n", ", ", ": ", "", "\n\n", " - "]

texts = st.lists(
    st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from(SEPARATORS)), min_size=1, max_size=30
).map(lambda parts: "".join(f + s for f, s in parts))


def _reference(text: str):  # type: ignore[no-untyped-def]
    return _finish(text, _candidates(text, DETECTORS))


@settings(max_examples=150, deadline=None)
@given(texts)
def test_windowed_scan_equals_full_text_scan(text: str) -> None:
    assert scan(text) == _reference(text)


@settings(max_examples=150, deadline=None)
@given(texts)
def test_first_volatile_is_the_first_router_value_of_a_full_scan(text: str) -> None:
    expected = next(
        (m for m in _reference(text) if m.kind in ROUTER_KINDS and not m.long_lived), None
    )
    assert first_volatile(text) == expected


def test_plain_small_numbers_seed_no_window() -> None:
    text = "1. Be brief.\n2. Cite section 3 of 10 (GPT-4o, v2).\n" * 20
    assert windows(text, dotted=False) == []


def test_windows_are_sorted_disjoint_and_cut_no_token() -> None:
    text = ("word " * 30 + "id 3f2a9c1b7d4e5f60a1b2 at 2024-05-20 10:00 ") * 5
    spans = windows(text, dotted=True)
    assert spans and all(a[1] < b[0] for a, b in itertools.pairwise(spans))
    for lo, hi, _ in spans:
        assert lo == 0 or text[lo - 1] in " \n"
        assert hi == len(text) or text[hi] in " \n"


@settings(max_examples=150, deadline=None)
@given(texts, st.randoms(use_true_random=False))
def test_memoised_windows_equal_computed_ones(text: str, rng) -> None:  # type: ignore[no-untyped-def]
    """Short texts' windows are memoised by shape (ASCII digits alike): a text that differs
    from a memoised one only in its digits gets the windows computed for itself."""
    from templates_audit.detectors import regions

    text = text[:regions._SHAPED_MAX_CHARS]
    for dotted in (True, False):
        assert windows(text, dotted=dotted) == regions._windows(text, dotted, ())
        other = "".join(str(rng.randrange(10)) if c in "0123456789" else c for c in text)
        assert windows(other, dotted=dotted) == regions._windows(other, dotted, ())
