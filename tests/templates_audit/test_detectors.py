"""Table-driven tests of the volatile-token detectors: one case per line, the comment says what
the case proves."""

from __future__ import annotations

import itertools

import pytest

import templates_audit.detectors as det
from templates_audit.detectors import ROUTER_KINDS, Kind, Match, first_volatile, scan

T, D, TM = Kind.TIMESTAMP, Kind.DATE, Kind.TIME

# (text, kind, exact value expected among scan(text))
DETECTED = [
    # --- timestamps
    ("Current time: 2023-04-20 06:52:11Z.", T, "2023-04-20 06:52:11Z"),  # ISO, space, Z
    ("at 2025-10-18T15:58:49+00:00)", T, "2025-10-18T15:58:49+00:00"),  # ISO T + offset
    ("t=2024-01-02T03:04:05.123456Z", T, "2024-01-02T03:04:05.123456Z"),  # fractions
    ("Session: 2026-07-14 01:49.", T, "2026-07-14 01:49"),  # minutes only
    ("Date: Wed, 07 Dec 2022 22:50:56 +0000", T, "Wed, 07 Dec 2022 22:50:56 +0000"),  # RFC 2822
    ("is Sun, 30 Oct 2022 16:13:49 GMT.", T, "Sun, 30 Oct 2022 16:13:49 GMT"),  # RFC 2822 GMT
    (
        "time: Wednesday, December 07, 2022 22:50:56 UTC.",
        T,
        "Wednesday, December 07, 2022 22:50:56 UTC",
    ),  # long form, weekday merged in
    ("Current date: 08:32PM Monday, May 13, 2024", T, "08:32PM Monday, May 13, 2024"),  # time first
    ("[1745440358947] Mouse movement", T, "1745440358947"),  # epoch milliseconds
    ("created 1700000123 by", T, "1700000123"),  # epoch seconds
    (
        "is Thu May 14 2026 19:00:00 GMT+0000 (Coordinated Universal Time).",
        T,
        "Thu May 14 2026 19:00:00 GMT+0000 (Coordinated Universal Time)",
    ),  # JavaScript Date.toString()
    (
        "time is Sunday, March 1, 2026 at 7 PM Atlantic/Reykjavik.",
        T,
        "Sunday, March 1, 2026 at 7 PM Atlantic/Reykjavik",
    ),  # `at` joiner, hour-only time, IANA zone
    (
        "is 04:23 PM EDT on Wednesday, May 14, 2025.",
        T,
        "04:23 PM EDT on Wednesday, May 14, 2025",
    ),  # `on` joiner, US zone
    ("is Saturday, 23:57 04 April 2026 (x)", T, "Saturday, 23:57 04 April 2026"),  # wd, time, date
    ("at: 01/16/2026, 19:29 GMT", T, "01/16/2026, 19:29 GMT"),  # US numeric date + time
    ("is Tuesday, May 13, 2025, 4:31:29 AM UTC", T, "Tuesday, May 13, 2025, 4:31:29 AM UTC"),
    # --- dates
    ("Current date: 2024-05-20", D, "2024-05-20"),  # ISO
    ("on 2024/05/20 we", D, "2024/05/20"),  # slashes
    ("on 05/20/2024 we", D, "05/20/2024"),  # US order
    ("am 20.05.2024 um", D, "20.05.2024"),  # German order
    ("Date: 24-02-2026", D, "24-02-2026"),  # dd-mm-yyyy
    ("Current date: December 01 2022", D, "December 01 2022"),  # month name, no comma
    ("Today's date is Monday, Aug 18, 2025.", D, "Monday, Aug 18, 2025"),  # abbreviated month
    ("Today is Thursday, 24 April 2025 in x", D, "Thursday, 24 April 2025"),  # day-month-year
    ("The current date is Tuesday, April 29, 2025.", D, "Tuesday, April 29, 2025"),
    ("The current date is November 7, 2025.", D, "November 7, 2025"),  # one-digit day
    ("Today is Fri Aug 29 2025.", D, "Fri Aug 29 2025"),  # JS toDateString
    ("date: Mon 19 Jan 2075", D, "Mon 19 Jan 2075"),  # weekday, day, month
    ("on the 7th of May, 2025", D, "7th of May, 2025"),  # ordinal + `of`
    ("当前日期: 2024-08-21 星期三", D, "2024-08-21 星期三"),  # ISO + Chinese weekday
    ("今天是2024年8月21日，", D, "2024年8月21日"),  # CJK date
    ("(Jul 14, 2025)", D, "Jul 14, 2025"),  # in brackets
    ("It is currently June 2026. The", D, "June 2026"),  # month-year after a "now" cue
    # --- times
    ("clock 22:50:56 now", TM, "22:50:56"),  # seconds
    ("at 8:32 PM sharp", TM, "8:32 PM"),  # AM/PM
    ("at 14:05 UTC,", TM, "14:05 UTC"),  # timezone
    ("at 19:29 each", TM, "19:29"),  # bare two-digit hour
    # --- identifiers
    (
        "ctr/48193ee0-f52d-41cd-ac65-ee28766bc853 x",
        Kind.UUID,
        "48193ee0-f52d-41cd-ac65-ee28766bc853",
    ),
    ("T-7A5C84CC-5040-47FA-884B-A6E814569614", Kind.UUID, "7A5C84CC-5040-47FA-884B-A6E814569614"),
    ("request id 3f2a9c1b7d4e5f60a1b2 ok", Kind.HEX_ID, "3f2a9c1b7d4e5f60a1b2"),  # 20 hex
    (
        "sha 0x9f86d081884c7d659a2feaa0c55ad015 done",
        Kind.HEX_ID,
        "9f86d081884c7d659a2feaa0c55ad015",
    ),
    ("id req_8f7e6d5c4b3a2910 is", Kind.HEX_ID, "req_8f7e6d5c4b3a2910"),  # prefixed id
    ("for user 1234577 only", Kind.NUMERIC_ID, "1234577"),  # cue + 7 digits
    ("order #88812345 shipped", Kind.NUMERIC_ID, "88812345"),  # `#` + 8 digits
    ("ticket: 55512 open", Kind.NUMERIC_ID, "55512"),  # cue + 5 digits
    ("ref 982734650012 x", Kind.NUMERIC_ID, "982734650012"),  # 12 bare digits, not epoch-like
    # --- others
    ("mail alice.smith+x@example.co.uk now", Kind.EMAIL, "alice.smith+x@example.co.uk"),
    ("Personality: v2", Kind.VERSION, "v2"),  # v-prefixed prompt version
    ("prompt v3.5.0 loaded", Kind.VERSION, "v3.5.0"),
    ("running version 2.1.4 of", Kind.VERSION, "2.1.4"),  # cue makes a bare number a version
    ("OS Version: Darwin 24.6.0", Kind.VERSION, "24.6.0"),  # cue + product word
    ("model ID is claude-sonnet-4-20250514.", Kind.VERSION, "20250514"),  # dated model id
    ("The user's name is Alice Smith, and", Kind.NAME, "Alice Smith"),
    ("You are talking to Bob.", Kind.NAME, "Bob"),
    ("Hello Maria, how", Kind.NAME, "Maria"),
    ("User: Jean-Luc\n", Kind.NAME, "Jean-Luc"),
    ("The current user's name is: Mars", Kind.NAME, "Mars"),
    (
        "key sk-proj-abc123DEF456ghi789JKL012mno end",
        Kind.SECRET,
        "sk-proj-abc123DEF456ghi789JKL012mno",
    ),
    ("AKIAIOSFODNN7EXAMPL3 in", Kind.SECRET, "AKIAIOSFODNN7EXAMPL3"),
]


@pytest.mark.parametrize(("text", "kind", "value"), DETECTED)
def test_detected(text: str, kind: Kind, value: str) -> None:
    found = [(m.kind, m.value) for m in scan(text)]
    assert (kind, value) in found, found


# Texts that must produce no router-kind match (the router would cut its key there).
NOT_VOLATILE = [
    "Use deadbeef-dead-beef-dead-beefdeadbeef as the example id.",  # a UUID-shaped placeholder
    "The company was founded in 1998.",  # a year in prose
    "Lessons from the 2008 financial crisis.",  # a year as adjective
    "Python 3.11 is supported.",  # language version in prose
    "It costs $1,234,567 in total.",  # amount with separators
    "It costs $12345678.",  # amount without separators
    "Call +1 (415) 555-0100 or 415-555-0100.",  # phone numbers
    "Phone: 4155550100",  # unformatted phone number after a phone cue
    "Use colour #ffffff or #123456 for text.",  # CSS colours
    "Retry at most 3 times, wait 10 seconds.",  # short numbers
    "Error at line 1234, column 56.",  # line numbers
    "Listen on localhost:8080 and 127.0.0.1:11434.",  # ports and an IP
    "Decade after decade; December is cold.",  # month name alone
    "Meet on Monday.",  # weekday alone
    "The March 2020 lockdown.",  # month-year without a "now" cue
    "Read John 3:16 aloud.",  # verse reference, 1-digit hour, no AM/PM
    "Use a 16:9 aspect ratio.",  # 1-digit minutes
    "Test with 1234567890 as a sample.",  # counting sequence, not an epoch
    "Dependencies: requests==2.31.0, starlette>=0.37",  # dependency pins
    "deadbeefdeadbeefcafe is a magic value",  # hex without digits (a word pattern)
    "The template says {{currentDateTime}} and {CURRENT_DATE} and ${var} and {}.",  # slots
    "Use sk-xxxxxxxxxxxxxxxxxxxxxxxx as the key.",  # placeholder key
    "Send Authorization: Bearer YOUR_API_KEY_HERE_12345",  # placeholder bearer
    "Knowledge cutoff: 2023-10",  # per-release, not per-request
    "Your knowledge base was last updated on Sunday, October 1, 2023.",  # cutoff as full date
    "It is 2026 this year.",  # per-year
    "Kimi诞生于2023年10月10日。",  # a fixed event date ("born on")
    "GPT-4o and o1 and H100 GPUs",  # model names with digits
    "Co-Authored-By: Devin <158243242+devin-ai-integration[bot]@users.noreply.github.com>",
]


@pytest.mark.parametrize("text", NOT_VOLATILE)
def test_not_volatile(text: str) -> None:
    cut = [m for m in scan(text) if m.kind in ROUTER_KINDS and not m.long_lived]
    assert cut == []
    assert first_volatile(text) is None


# Versions: a `v`-prefixed or cued version is a prompt/product version; a dependency pin or a
# bare number in prose is not.
VERSIONS = [
    ("Personality: v2", ["v2"]),  # prompt version
    ("pip install pkg==v1.2.3", []),  # pinned dependency
    ("uses pkg@v4 action", []),  # pinned GitHub action
    ("Python 3.11 and Node 20.1", []),  # bare numbers in prose
    ("version: 1.2.3", ["1.2.3"]),  # cue
    ("IDE build 0.1.16 ready", ["0.1.16"]),  # cue `build`
]


@pytest.mark.parametrize(("text", "values"), VERSIONS)
def test_version_rule(text: str, values: list[str]) -> None:
    assert [m.value for m in scan(text, {Kind.VERSION})] == values


LONG_LIVED = [
    ("Knowledge cutoff: 2023-10", "2023-10"),  # ISO year-month
    ("knowledge cutoff: 2021-09\n", "2021-09"),
    ("It was last updated in August 2023.", "August 2023"),  # month year
    ("Your knowledge cutoff is December 2023.", "December 2023"),
    ("<knowledge_cutoff>\nMarch 2025\n</knowledge_cutoff>", "March 2025"),  # inside a tag
    ("Knowledge Cutoff: January 1, 2025.", "January 1, 2025"),  # a full date as cutoff
    ("Your knowledge cutoff date is 2026.", "2026"),  # year only
    ("The current year is 2025", "2025"),  # per-year
    ("remember it is 2026 this year.", "2026"),
    ("the current year (2026)", "2026"),
]


@pytest.mark.parametrize(("text", "value"), LONG_LIVED)
def test_long_lived_dates(text: str, value: str) -> None:
    (m,) = scan(text)
    assert (m.kind, m.value, m.long_lived) == (Kind.DATE, value, True)
    assert first_volatile(text) is None


def test_cutoff_cue_does_not_swallow_the_current_date() -> None:
    text = "Knowledge cutoff: 2024-06 Current date: 2025-01-02"
    fv = first_volatile(text)
    assert fv is not None and fv.value == "2025-01-02" and not fv.long_lived


def test_first_volatile_is_the_earliest_router_kind_value() -> None:
    text = "You are Kimi, v2. Email a@b.co. Knowledge cutoff: 2023-10.\nCurrent date: 2024-05-20."
    fv = first_volatile(text)
    assert fv == Match(
        Kind.DATE, text.index("2024"), text.index("2024") + 10, "2024-05-20", "iso_date"
    )


def test_first_volatile_finds_a_jwt() -> None:
    token = _jwt({"alg": "HS256", "typ": "JWT"}, {"sub": "abc", "name": "Ann"})
    fv = first_volatile(f"Authorization token: {token} end")
    assert fv is not None and fv.kind is Kind.SECRET and fv.value == token


def test_email_is_not_a_router_kind() -> None:
    assert Kind.EMAIL not in ROUTER_KINDS
    assert first_volatile("Contact support@example.com for help.") is None


def test_scan_kinds_filters_the_full_scan() -> None:
    text = "v1.2 at 2024-05-20 10:00 by bob@example.com, id 48193ee0-f52d-41cd-ac65-ee28766bc853"
    full = scan(text)
    assert scan(text, {Kind.UUID, Kind.EMAIL}) == [
        m for m in full if m.kind in {Kind.UUID, Kind.EMAIL}
    ]


def test_match_invariants() -> None:
    text = "\n".join(t for t, _, _ in DETECTED)
    found = scan(text)
    assert found == sorted(found, key=lambda m: m.start)
    assert all(a.end <= b.start for a, b in itertools.pairwise(found))
    assert all(text[m.start : m.end] == m.value for m in found)


def _jwt(header: dict[str, object], payload: dict[str, object]) -> str:
    import base64
    import json

    def enc(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{enc(header)}.{enc(payload)}.c2lnbmF0dXJl"


SECRETS = [
    ("sk-proj-abc123DEF456ghi789JKL012mno", True),  # OpenAI project key
    ("sk-ant-api03-AbC123dEf456GhI789jKl012", True),  # Anthropic key
    ("AKIAIOSFODNN7EXAMPL3", True),  # AWS access key id
    ("ghp_1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R", True),  # GitHub token
    ("xoxb-123456789012-abcdefABCDEF", True),  # Slack bot token
    ("Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0", True),  # bearer token
    ("  sk-proj-abc123DEF456ghi789JKL012mno\n", True),  # surrounding whitespace ignored
    ("sk_live_0826b94b6f7b66aa11603dad2a7ddcd1", True),  # Stripe secret key
    ("rk_test_51HxQ2bC3dE4fG5hI6jK7lM8n", True),  # Stripe restricted key
    ("pk_live_0826b94b6f7b66aa11603dad2a7ddcd1", False),  # Stripe publishable key: public
    ("sk_live_xxxxxxxxxxxxxxxxxxxxxxxx", False),  # placeholder run
    ("sk-xxxxxxxxxxxxxxxxxxxxxxxx", False),  # placeholder run
    ("Bearer YOUR_TOKEN_1234567890", False),  # placeholder words
    ("sk-short1", False),  # too short
    ("hello world", False),  # prose
    # issue 19: a JWT's structure is enough, whether or not the payload decodes (encrypted,
    # opaque): its header decodes to a JSON object
    ("eyJhbGciOiJIUzI1NiJ9.eyJub3Rqc29u.sig", True),
    ("eyJhbGciOiJIUzI1NiJ9.Zx8a9dkfjQ2lkdfj3kdfjKDJFkd3.c2ln", True),  # payload not eyJ
    ("eyJabc12.xyzxyz12.sig", False),  # header no JSON, segments too short to be random
    ("api_key=98RRp9o/2eMQtvWlikzChXbmYL5+B2kV", False),  # keyword + value: scan's, not a token
]


@pytest.mark.parametrize(("value", "expected"), SECRETS)
def test_is_secret(value: str, expected: bool) -> None:
    assert det.is_secret(value) is expected


def test_is_secret_accepts_a_real_jwt_only() -> None:
    good = _jwt({"alg": "HS256"}, {"sub": "1234567890", "iat": 1516239022})
    assert det.is_secret(good)
    assert not det.is_secret("eyJ" + good[3:].replace(".", "!"))


def test_public_api_is_pinned() -> None:
    assert set(det.__all__) == {
        "DETECTORS",
        "LONG_LIVED_DETECTORS",
        "ROUTER_KINDS",
        "Detector",
        "Kind",
        "Match",
        "classify",
        "first_volatile",
        "is_secret",
        "scan",
    }
    assert [k.value for k in Kind] == [
        "timestamp", "date", "time", "uuid", "hex_id", "numeric_id", "name", "email",
        "version", "secret", "reordered_block", "whitespace", "other", "sampled_block",
        "variant",
    ]  # fmt: skip
    assert ROUTER_KINDS == {T, D, TM, Kind.UUID, Kind.HEX_ID, Kind.NUMERIC_ID, Kind.SECRET}


def test_detector_names_are_unique_and_stable() -> None:
    names = [d.name for d in det.DETECTORS]
    assert len(names) == len(set(names))
    assert det.LONG_LIVED_DETECTORS == {"knowledge_cutoff", "current_year", "event_date"}
