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
import re

_CONTEXT = 64  # characters of left context the context rules look at


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


def compact_date_ok(m: re.Match[str], text: str) -> bool:
    """`YYYYMMDD` must be a real calendar date."""
    digits = m["v"]
    return valid_ymd(int(digits[:4]), int(digits[4:6]), int(digits[6:8]))


# Epoch values from 2001-09-09 (1e9 s) to 2036-07-18 (2.1e9 s): the window where a 10-digit
# number starting with 1 or 20 is far more likely a timestamp than anything else.
_EPOCH_MIN, _EPOCH_MAX = 1_000_000_000, 2_100_000_000


def epoch_ok(m: re.Match[str], text: str) -> bool:
    """10 digits = seconds, 13 = milliseconds, in the plausible window; not 1234567890."""
    digits = m["v"] if "v" in m.re.groupindex else m[0]
    if is_sequential(digits):
        return False
    seconds = int(digits) // (1000 if len(digits) == 13 else 1)
    return _EPOCH_MIN <= seconds <= _EPOCH_MAX


def is_sequential(digits: str) -> bool:
    """`1234567890`, `9876543210`, `0000000000`: sample values, not identifiers."""
    steps = {(int(b) - int(a)) % 10 for a, b in itertools.pairwise(digits)}
    return len(steps) == 1 and steps <= {0, 1, 9}


_PHONE_CUE = re.compile(r"(?i)(?:phone|tel|fax|call|mobile|whatsapp|sms)\b[^\n]{0,16}$")


def numeric_id_ok(m: re.Match[str], text: str) -> bool:
    """A long digit run that is not a phone number, an amount or a counting sequence."""
    start, end = span(m)
    digits = text[start:end]
    if is_sequential(digits):
        return False
    before = text[max(0, start - 24) : start]
    return not _PHONE_CUE.search(before)


def hex_id_ok(m: re.Match[str], text: str) -> bool:
    """>= 16 hex chars with both digits and letters, in one case (ids, digests; not words)."""
    value = m["v"] if "v" in m.re.groupindex else m[0]
    if value[:2] in ("0x", "0X"):
        value = value[2:]
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
    """A JWT is kept only if its header and payload base64url-decode to JSON objects."""
    header, payload = m["h"], m["p"]
    return _b64url_json(header) and _b64url_json(payload)


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


def name_ok(m: re.Match[str], text: str) -> bool:
    """The first word after a name cue must not be a stop word or a placeholder in capitals."""
    first = m["v"].split()[0]
    return first not in NOT_NAMES and not first.isupper()


_RELEASE_CUE = re.compile(
    r"(?i)(?:knowledge|cut-?off|last\s+updated|trained|training\s+data|information\s+up\s+to"
    r"|data\s+up\s+to|knowledge_cutoff)[^\n.!?]{0,40}$"
)


def in_release_context(text: str, start: int) -> bool:
    """True if the left context (same sentence) says this date is a knowledge cutoff/update."""
    return _RELEASE_CUE.search(text, max(0, start - _CONTEXT), start) is not None


_DEP_CUE = re.compile(r"(?:==|>=|<=|~=|!=|\^|~|@|\s-\s)\s*$")


def version_ok(m: re.Match[str], text: str) -> bool:
    """A `v`-prefixed version is a prompt/product version unless it pins a dependency."""
    start, _ = span(m)
    return not _DEP_CUE.search(text, max(0, start - 4), start)
