"""`classify`: the kind of a span already known to vary between requests.

The auditor finds varying spans by diffing renders, so a span is often a fragment of a value
(`1` of `2024-05-21`) or a value without a pattern (a country, a counter). Rules, in order:
1. only whitespace -> `whitespace`; a credential -> `secret`;
2. scan a window of context around the span; the detected value overlapping the span most
   gives the kind (so a fragment inherits the kind of the value it belongs to);
3. otherwise look at the span widened to whole words: weekday/month names and years are
   dates, long digit runs numeric ids, mixed hex ids and long opaque tokens (ULIDs) `hex_id`,
   IPv4 addresses `other`, dotted numbers versions, `@` emails, other id-shaped tokens
   (`shapes.id_shaped`: `E40522`, `cus_Qhf9ZHiE2ZpMc4`) `numeric_id` or `hex_id` by whether
   digits or letters dominate;
4. a name-shaped run (`shapes.name_shaped`) after a name cue ("name is", "User:", "Hello",
   "Patient:") is a name;
5. anything else is `other`.
Never raises. Cost: one `scan` over at most 2 * 96 characters plus the span.
"""

from __future__ import annotations

import re

from .credentials import is_secret
from .kinds import Kind
from .scan import scan
from .shapes import id_shaped, name_shaped

_WINDOW = 96
_WEEKDAY_OR_MONTH = re.compile(
    r"(?i)(?:mon|tues?|wed(?:nes)?|thu(?:rs?)?|fri|sat(?:ur)?|sun)(?:day)?"
    r"|jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
    r"|(?:星期|周|週)[一二三四五六日天]"
)
_EMAIL = re.compile(r"[^@\s]+@[^@\s/]+\.[A-Za-z]{2,}")
_VERSION = re.compile(r"[vV]?\d+(?:\.\d+)+")
_HEX = re.compile(r"(?:0[xX])?[0-9a-fA-F]{8,}")
_IPV4 = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})")
_OPAQUE = re.compile(r"[A-Za-z0-9_-]{16,}")  # a ULID, a session token: letters and digits mixed
_NAME_CUE = re.compile(
    # \b: "codename", "filename" are no cue; "username", "surname" are
    r"(?i)\b(?:(?:user|nick|sur|first|last|full|display|given|family)?name|named|called|user"
    r"|talking\s+to|speaking\s+(?:to|with)|hello|hi|hey|dear"
    r"|customer|client|patient|member|employee|guest|caller|student|prospect)"
    r"[\s:,'\"]*$"
)


def _overlapping_kind(before: str, value: str, after: str) -> Kind | None:
    text = before + value + after
    lo, hi = len(before), len(before) + len(value)
    best: tuple[int, int] | None = None
    kind: Kind | None = None
    for m in scan(text):
        overlap = min(hi, m.end) - max(lo, m.start)
        if overlap > 0 and (best is None or (overlap, -m.start) > best):
            best, kind = (overlap, -m.start), m.kind
    return kind


def _widen(before: str, value: str, after: str) -> tuple[str, str]:
    """The span extended to whole words (a diff often cuts inside a token), and the text
    before the widened span."""
    left = len(before)
    while left > 0 and before[left - 1].isalnum():
        left -= 1
    right = 0
    while right < len(after) and after[right].isalnum():
        right += 1
    return (before[left:] + value + after[:right]).strip(), before[:left]


def _token_kind(token: str) -> Kind | None:
    if _WEEKDAY_OR_MONTH.fullmatch(token):
        return Kind.DATE
    if token.isascii() and token.isdigit():  # `'²'.isdigit()` is True, `int('²')` raises
        if len(token) == 4 and 1900 <= int(token) <= 2199:
            return Kind.DATE
        return Kind.NUMERIC_ID if len(token) >= 5 else Kind.OTHER
    if _EMAIL.fullmatch(token):
        return Kind.EMAIL
    ip = _IPV4.fullmatch(token)
    if ip and all(int(part) <= 255 for part in ip.groups()):
        return Kind.OTHER  # an address, not a version (a cued "version 1.2.3.4" is caught earlier)
    if _VERSION.fullmatch(token):
        return Kind.VERSION
    if (
        _HEX.fullmatch(token)
        and any(c.isdigit() for c in token)
        and any(c.isalpha() for c in token)
    ):
        return Kind.HEX_ID
    if (
        _OPAQUE.fullmatch(token)
        and sum(c.isdigit() for c in token) >= 4
        and sum(c.isalpha() for c in token) >= 4
    ):
        return Kind.HEX_ID  # an opaque id: the kinds have no closer name
    if id_shaped(token):  # `E40522`, `OD-227-568-Y`, `usr_4vg8898eta`, `4412 0091 7730`
        digits = sum(c.isdigit() for c in token)
        return Kind.NUMERIC_ID if digits >= sum(c.isalpha() for c in token) else Kind.HEX_ID
    return None


def classify(before: str, value: str, after: str = "") -> Kind:
    """Kind of `value`, a span that varies between requests, given its surrounding text."""
    if not value:
        return Kind.OTHER
    if not value.strip():
        return Kind.WHITESPACE
    if is_secret(value):
        return Kind.SECRET
    before, after = before[-_WINDOW:], after[:_WINDOW]
    kind = _overlapping_kind(before, value, after)
    if kind is not None:
        return kind
    token, left_context = _widen(before, value, after)
    kind = _token_kind(token)
    if kind is not None:
        return kind
    if name_shaped(token) and _NAME_CUE.search(left_context):
        return Kind.NAME
    return Kind.OTHER
