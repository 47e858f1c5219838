"""classify(): the kind of a span the auditor found varying between two renders. Spans are
often fragments of a value (a diff stops at the first differing character) or values with no
pattern (a country); one case per line, the comment says what it proves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from templates_audit.detectors import Kind, classify, first_volatile, scan

CASES = [
    ("a", "  \n", "b", Kind.WHITESPACE),  # only whitespace differs
    ("a", "", "b", Kind.OTHER),  # empty side of an insertion: nothing to classify
    ("Current date: 2024-05-2", "1", "\nBe brief.", Kind.DATE),  # fragment inherits its date
    ("Current time: 2023-04-20 06:5", "2", ":11Z.", Kind.TIMESTAMP),  # fragment of a timestamp
    ("Now: 14:0", "5", " UTC.", Kind.TIME),  # fragment of a time
    ("container/48193ee0-f52d-41cd-", "ac65", "-ee28766bc853", Kind.UUID),
    ("key: ", "sk-proj-abc123DEF456ghi789JKL012mno", "", Kind.SECRET),
    ("The user's name is ", "Alice", ".", Kind.NAME),  # name cue
    ("You are talking to ", "Bob", " today.", Kind.NAME),
    ("The user is in ", "Italy", ".", Kind.OTHER),  # country: no value pattern
    ("User location: ", "Iceland", "", Kind.OTHER),
    ("User timezone: ", "Europe/Paris", "", Kind.OTHER),
    ("Today is ", "Monday", ".", Kind.DATE),  # a weekday on its own
    ("Today is ", "Mon", "day.", Kind.DATE),  # a weekday fragment, widened to the word
    ("in ", "June", " we", Kind.DATE),  # a month on its own
    ("Copyright ", "2026", ".", Kind.DATE),  # a year on its own
    ("This is turn number ", "1", ".", Kind.OTHER),  # a small counter
    ("build ", "ab12cd34", " ok", Kind.HEX_ID),  # short hex id
    ("model claude-haiku-", "4.5", ".", Kind.VERSION),  # dotted number
    ("mail ", "bob@example.io", " now", Kind.EMAIL),
    ("id ", "99812345", "", Kind.NUMERIC_ID),
    ("order ", "12345", "", Kind.NUMERIC_ID),  # 5 digits after a cue
    ("The date is ", "{{currentDateTime}}", ".", Kind.OTHER),  # a template slot is constant text
    ("x ", "²²²²", " y", Kind.OTHER),  # Unicode digits: no int() on them, no exception
    ("Client IP: ", "10.0.3.17", "\n", Kind.OTHER),  # an IPv4 address is not a version
    ("build ", "10.0.19041.1", " ok", Kind.VERSION),  # four parts, one over 255: a version
    ("trace ", "01HZX3K9QKQ8V9M2N7P5R4T6W8", "\n", Kind.HEX_ID),  # a ULID: an opaque id
    ("see ", "internationalization", " docs", Kind.OTHER),  # a long word is not an id
]


@pytest.mark.parametrize(("before", "value", "after", "kind"), CASES)
def test_classify(before: str, value: str, after: str, kind: Kind) -> None:
    assert classify(before, value, after) is kind


# digits, Unicode digits and value punctuation are over-represented so that date/number paths
# are exercised, not only prose
_chars = st.one_of(st.characters(), st.sampled_from(list("0123456789²٣:-/.@ Tx")))
_texts = st.text(alphabet=_chars, max_size=80)


@settings(max_examples=120, deadline=None)
@given(_texts, _texts, _texts)
def test_classify_never_raises(before: str, value: str, after: str) -> None:
    assert isinstance(classify(before, value, after), Kind)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=_chars, max_size=300))
def test_scan_and_first_volatile_accept_any_text(text: str) -> None:
    for m in scan(text):
        assert text[m.start : m.end] == m.value
    fv = first_volatile(text)
    assert fv is None or text[fv.start : fv.end] == fv.value
