"""Validity checks and false-positive filters, one function per rule.

Patterns (patterns.py) are deliberately loose enough to find real-world forms; each candidate
they produce is then checked here. A validator takes the regex match and the whole text (so it
can look at context) and returns False to drop the candidate. All checks are O(length of the
candidate + a bounded context window), so they cost nothing next to the regex scan.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
from collections import Counter

_CONTEXT = 128  # characters of left context the context rules look at


def span(m: re.Match[str]) -> tuple[int, int]:
    """The value span of a match: named group `v` if the pattern has one, else the whole match."""
    if "v" in m.re.groupindex and m.start("v") >= 0:
        return m.start("v"), m.end("v")
    return m.start(), m.end()


def valid_ymd(year: int, month: int, day: int) -> bool:
    """A calendar date in 1900-2199 (days per month without leap-year precision: 29 Feb ok)."""
    if not (1900 <= year <= 2199 and 1 <= month <= 12 and day >= 1):
        return False
    return day <= (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]


def iso_date_ok(m: re.Match[str], text: str) -> bool:
    """`YYYY-MM-DD` (any of -/. as separator) must be a real calendar date."""
    return valid_ymd(int(m["y"]), int(m["mo"]), int(m["d"]))


def numeric_date_ok(m: re.Match[str], text: str) -> bool:
    """`AA/BB/YYYY`: accepted if either month/day (US) or day/month (EU) reading is a real date."""
    a, b, year = int(m["a"]), int(m["b"]), int(m["y"])
    return valid_ymd(year, a, b) or valid_ymd(year, b, a)


def short_year_date_ok(m: re.Match[str], text: str) -> bool:
    """`03/04/25`: a real date in 2000-2099 read month/day or day/month; a dotted one is not
    a version (`version 10.11.12`)."""
    a, b, year = int(m["a"]), int(m["b"]), 2000 + int(m["y"])
    if not (valid_ymd(year, a, b) or valid_ymd(year, b, a)):
        return False
    start = m.start()
    return m["sep"] == "/" or _VERSION_CUE.search(text, max(0, start - 48), start) is None


def compact_date_ok(m: re.Match[str], text: str) -> bool:
    """`YYYYMMDD` must be a real calendar date."""
    digits = m[0]
    return valid_ymd(int(digits[:4]), int(digits[4:6]), int(digits[6:8]))


# Epoch values from 2001-09-09 (1e9 s) to 2033-05-18 (2e9 s): the pattern's 10 (or 13) digits
# starting with 1; in that window such a number is far more likely a timestamp than an id.
_EPOCH_MIN, _EPOCH_MAX = 1_000_000_000, 1_999_999_999


def epoch_ok(m: re.Match[str], text: str) -> bool:
    """10 digits = seconds, 13 = milliseconds, in the plausible window; not 1234567890."""
    digits = m[0]
    if is_sequential(digits):
        return False
    seconds = int(digits) // (1000 if len(digits) == 13 else 1)
    return _EPOCH_MIN <= seconds <= _EPOCH_MAX


def is_sequential(digits: str) -> bool:
    """`1234567890`, `9876543210`, `0000000000`: sample values, not identifiers."""
    steps = {(int(b) - int(a)) % 10 for a, b in itertools.pairwise(digits)}
    return len(steps) == 1 and steps <= {0, 1, 9}


_PHONE_CUE = re.compile(r"(?i)\b(?:phone|tel|fax|call|mobile|whatsapp|sms)\b[^\n]{0,16}$")
_ID_CUE = re.compile(
    r"(?i)(?:\b(?:id|user|order|account|ticket|session|request|customer|invoice|case|no\.?"
    r"|number)\b\s*(?:#|:|=|is)?\s*#?|#)$"
)


def numeric_id_ok(m: re.Match[str], text: str) -> bool:
    """>= 8 digits alone or >= 5 after an id cue; not a phone number or a counting sequence."""
    start, digits = m.start(), m[0]
    if is_sequential(digits):
        return False
    before = text[max(0, start - 24) : start]
    if _PHONE_CUE.search(before):
        return False
    if before.endswith("#"):
        return len(digits) >= 7  # `#123456` is a CSS colour more often than an order number
    return len(digits) >= 8 or _ID_CUE.search(before) is not None


def day_ok(m: re.Match[str], text: str) -> bool:
    """The day of a month-name date is 1-31."""
    return 1 <= int(m["d"]) <= 31


def clock_ok(m: re.Match[str], text: str) -> bool:
    """Hour 0-23, or 1-12 with AM/PM."""
    hour = int(m["h"])
    if "ampm" in m.re.groupindex and m["ampm"]:
        return 1 <= hour <= 12
    return hour <= 23


def dated_model_id_ok(m: re.Match[str], text: str) -> bool:
    """`claude-sonnet-4-20250514`: a YYYYMMDD release date glued to a model name by `-`."""
    start = m.start()
    glued = start >= 2 and text[start - 1] == "-" and (text[start - 2].isalnum())
    return glued and compact_date_ok(m, text)


def has_digit(m: re.Match[str], text: str) -> bool:
    """The value holds an ASCII digit (an id made of letters only is a placeholder)."""
    return any(c in "0123456789" for c in m[0])


def hex_id_ok(m: re.Match[str], text: str) -> bool:
    """>= 16 hex chars with both digits and letters, in one case (ids, digests; not words)."""
    start, value = m.start(), m[0]
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_-"):
        if not (text[start - 1] in "xX" and text[start - 2 : start - 1] == "0"):
            return False  # inside a longer token, except right after `0x`
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    one_case = value == value.lower() or value == value.upper()
    return has_digit and has_alpha and one_case and not is_low_entropy(value)


def prefixed_id_ok(m: re.Match[str], text: str) -> bool:
    """`req_…`, `chatcmpl-…`: the body must contain digits and not be a placeholder run."""
    body = m["body"]
    return any(c.isdigit() for c in body) and not is_low_entropy(body)


def is_low_entropy(value: str) -> bool:
    """Placeholders such as `sk-xxxxxxxxxxxx` or `0000…`: at most 4 distinct characters."""
    return len(set(value.lower())) <= 4


def looks_random(token: str) -> bool:
    """A credential-like token: mixes letters and digits and is not a placeholder run."""
    return (
        any(c.isdigit() for c in token)
        and any(c.isalpha() for c in token)
        and not is_low_entropy(token)
        and not _PLACEHOLDER_WORD.search(token)
    )


_PLACEHOLDER_WORD = re.compile(r"(?i)your|token|example|placeholder|redacted|here|<|\{|\$")


def secret_ok(m: re.Match[str], text: str) -> bool:
    """Key-shaped tokens: kept only if the variable part looks random."""
    return looks_random(m["body"])


def _b64url_json(part: str) -> bool:
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        return isinstance(json.loads(raw), dict)
    except (binascii.Error, ValueError):
        return False


def jwt_ok(m: re.Match[str], text: str) -> bool:
    """A JWT: its header base64url-decodes to a JSON object (the payload may be encrypted or
    opaque), or header and payload are both long random-looking segments."""
    header, payload = m["h"], m["p"]
    if _b64url_json(header):
        return True
    return len(header) >= 16 and len(payload) >= 16 and looks_random(payload)


def entropy_bits(value: str) -> float:
    """Shannon entropy of ``value``'s characters, bits per character."""
    counts = Counter(value)
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def keyword_secret_ok(m: re.Match[str], text: str) -> bool:
    """A value after a credential keyword: random-looking and of high entropy (>= 3.5 bits per
    character: a 16-character random token has ~4; `aaaabbbbccccdddd` has 2), not a path or a
    dotted name."""
    value = m["v"]
    if value.count("/") >= 2 or value.count(".") >= 2:
        return False
    return looks_random(value) and entropy_bits(value) >= 3.5


def prefixed_number_ok(m: re.Match[str], text: str) -> bool:
    """`ORD-414359285`: the digits are no counting run and the token is no phone number."""
    if is_sequential(m["n"]):
        return False
    return not _PHONE_CUE.search(text[max(0, m.start() - 24):m.start()])


# Capitalised words that follow name cues ("Hello World", "User: Please ...") but are not names.
NOT_NAMES: frozenset[str] = frozenset(
    """
    A An The I You We They He She It This That These Those There Here Hello Hi Hey Dear
    User Users Assistant Assistants System Human AI Bot Model Claude ChatGPT GPT Gemini Sir Madam
    World Everyone Everybody All Team Friend Friends Folks Guys Customer Client Admin Administrator
    What When Where Who Why How Which Please Thanks Thank Can Could Would Should Will Is Are Do
    Does Did Yes No Not Ok Okay Sure Note Today Tomorrow Yesterday Unknown None Null Anonymous
    Name First Last Full Welcome Good Morning Afternoon Evening Night Again Back
    Monday Tuesday Wednesday Thursday Friday Saturday Sunday
    January February March April May June July August September October November December
    """.split()
)


_ASSISTANT_CUE = re.compile(r"(?i)\b(?:your|my\s+own|assistant's)\s*$")


def name_ok(m: re.Match[str], text: str) -> bool:
    """The first word after a name cue must not be a stop word or a placeholder in capitals,
    and "Your name is X" names the assistant (constant), not the user."""
    first = m["v"].split()[0]
    if first in NOT_NAMES or first.isupper():
        return False
    return not _ASSISTANT_CUE.search(text, max(0, m.start() - 16), m.start())


# The cue, then up to 96 characters of the same sentence without digits or a "current/today"
# (so "cutoff: 2024-06. Current date: 2025-01-02" does not relabel the current date).
_RELEASE_CUE = re.compile(
    r"(?i)(?:knowledge|cut-?off|last\s+updated|trained|training\s+data|information\s+up\s+to"
    r"|data\s+up\s+to)(?:(?!current|today|now)[^\n.!?\d]){0,96}(?:\n[ \t]*)?$"
)
# dates in prose about fixed events: "founded on", "诞生于2023年10月10日" (born on)
_EVENT_CUE = re.compile(
    r"(?i)(?:born|founded|established|launched|released|incorporated|inaugurated|elected|died"
    r"|signed|诞生于|成立于|发布于|创立于)"
    r"[^\n.!?。]{0,12}$"
)


# Substrings one of which every cue contains: a plain `in` test skips the regex (which has no
# literal prefix and would be tried at every position of the context) in the common case.
_RELEASE_WORDS = ("know", "cut", "updated", "train", "up to")
_EVENT_WORDS = ("born", "found", "establish", "launch", "release", "incorporat", "inaugurat",
                "elect", "died", "signed", "于")  # fmt: skip


def in_release_context(text: str, start: int) -> bool:
    """True if the left context (same sentence) says this date is a knowledge cutoff/update."""
    lo = max(0, start - _CONTEXT)
    context = text[lo:start].lower()
    if not any(word in context for word in _RELEASE_WORDS):
        return False
    return _RELEASE_CUE.search(text, lo, start) is not None


def in_event_context(text: str, start: int) -> bool:
    """True if the date is introduced as the date of a fixed event (founded, born, released)."""
    lo = max(0, start - 32)
    context = text[lo:start].lower()
    if not any(word in context for word in _EVENT_WORDS):
        return False
    return _EVENT_CUE.search(text, lo, start) is not None


def cutoff_cue_ok(m: re.Match[str], text: str) -> bool:
    """A year or month-year is a knowledge cutoff only after a cutoff cue (or inside its tag)."""
    return in_release_context(text, m.start())


_NOW_CUE = re.compile(
    r"(?i)(?:currently|current\s+month|current\s+date|it\s+is|it's|today\s+is|now)"
    r"(?:\s+is)?[\s:]*(?:in\s+)?$"
)


def now_cue_ok(m: re.Match[str], text: str) -> bool:
    """`It is currently June 2026`, `Current month: May 2025` (not a knowledge cutoff)."""
    start = m.start()
    return _NOW_CUE.search(text, max(0, start - 32), start) is not None


_YEAR_BEFORE = re.compile(
    r"(?i)(?:current\s+year|this\s+year|the\s+year|it\s+is(?:\s+now)?|it's(?:\s+now)?)"
    r"(?:\s+is)?[\s:(]*$"
)
_YEAR_AFTER = re.compile(r"(?i)\s+(?:is\s+)?this\s+year")


def current_year_ok(m: re.Match[str], text: str) -> bool:
    """`The current year is 2025`, `it is 2026 this year`, `the current year (2026)`."""
    if _YEAR_BEFORE.search(text, max(0, m.start() - 32), m.start()):
        return True
    return _YEAR_AFTER.match(text, m.end()) is not None


_DEP_CUE = re.compile(r"(?:==|>=|<=|~=|!=|\^|~|@|\s-\s)\s*$")
# "version 2.1.4", "OS Version: Darwin 24.6.0", "Windows 11 Pro 10.0.26100", "Qoder IDE 0.1.16":
# a cue, then at most two words, then the number. "Python 3.11" has no cue and stays prose.
_VERSION_CUE = re.compile(
    r"(?:(?i:\bversion|\bver\.|\brelease|\bbuild)|\b(?:OS|IDE|SDK|API|Windows|macOS|Darwin"
    r"|Linux|iOS|Android))(?:\s+is)?[\s:=(]*(?:[A-Za-z0-9]+\s+){0,2}$"
)


_BUILD_CUE = re.compile(r"(?i)\b(?:build|rev|revision)(?:\s+(?:no\.?|number))?[\s:#=]*$")


def build_cue_ok(m: re.Match[str], text: str) -> bool:
    """A number right after `build`, `rev`, `revision` (`build 7860`, `Rev. 42` is no cue)."""
    start = m.start()
    return _BUILD_CUE.search(text, max(0, start - 24), start) is not None


def version_ok(m: re.Match[str], text: str) -> bool:
    """`v1.2` is a prompt/product version unless pinned like a dependency (`pkg==v1.2`,
    `pkg@v1.2`); a bare dotted number (`3.11`, `2.1.4`) only after a version cue."""
    start = m.start()
    if m[0][0] in "vV":
        return not _DEP_CUE.search(text, max(0, start - 4), start)
    return _VERSION_CUE.search(text, max(0, start - 48), start) is not None
