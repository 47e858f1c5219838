"""router.usage: the cached-token tap over relayed response bytes."""

from __future__ import annotations

import json

import pytest

from router.usage import TAIL_BYTES, Usage, UsageTap, parse_usage

USAGE = {"prompt_tokens": 120, "completion_tokens": 8, "total_tokens": 128,
         "prompt_tokens_details": {"cached_tokens": 96}}


def _sse(events: list[dict[str, object]]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


@pytest.mark.parametrize(("data", "expected"), [
    # a non-streamed answer: usage at the end of the body
    (json.dumps({"choices": [{"text": "hi"}], "usage": USAGE}).encode(), Usage(120, 96)),
    # compact and spaced JSON alike
    (b'{"usage": {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}}',
     Usage(7, 0)),
    # vLLM without --enable-prompt-tokens-details: no detail, prompt tokens only
    (b'{"usage":{"prompt_tokens":7,"prompt_tokens_details":null}}', Usage(7, None)),
    # no usage at all (a stream without include_usage)
    (_sse([{"choices": [{"delta": {"content": "x"}}]}]), Usage(None, None)),
    # generated text that spells the key is escaped inside its string: never read as usage
    (json.dumps({"choices": [{"text": '"cached_tokens": 5'}]}).encode(), Usage(None, None)),
    # a number cut at the end of what was kept is not read
    (b'{"usage":{"prompt_tokens":12', Usage(None, None)),
])
def test_parse_usage(data: bytes, expected: Usage) -> None:
    assert parse_usage(data) == expected


def test_stream_with_continuous_usage_reads_the_last_event() -> None:
    events = [{"choices": [{"delta": {"content": "a"}}], "usage": {
        "prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": i}}} for i in range(3)]
    events.append({"choices": [], "usage": USAGE})  # the include_usage final chunk
    tap = UsageTap()
    raw = _sse(events)
    for i in range(0, len(raw), 7):  # split anywhere, even inside the keys
        tap.feed(raw[i:i + 7])
    assert tap.usage() == Usage(120, 96)


def test_tap_keeps_only_a_bounded_tail() -> None:
    tap = UsageTap()
    tap.feed(json.dumps({"usage": USAGE}).encode())
    tap.feed(b"x" * (TAIL_BYTES * 3))  # the usage scrolled out of the tail
    assert tap.usage() == Usage(None, None)
    assert len(tap._tail) == TAIL_BYTES


def _int_after_by_hand(data: bytes, key: bytes) -> int | None:
    """The byte loop `_int_after` replaced (its regex must read exactly the same)."""
    at = data.rfind(key)
    if at < 0:
        return None
    i = at + len(key)
    n = len(data)
    while i < n and data[i] in b" \t\r\n":
        i += 1
    j = i
    while j < n and data[j] in b"0123456789":
        j += 1
    if j == i or j == n:
        return None
    return int(data[i:j])


def test_int_after_reads_what_the_byte_loop_read() -> None:
    import random

    from router.usage import _int_after

    rng = random.Random(18)
    alphabet = [b'"cached_tokens":', b" ", b"\n", b"\t", b"1", b"0", b"9", b"}", b",", b"x",
                b"-", b"null", b"\r", b'"']
    for _ in range(20000):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert _int_after(data, b'"cached_tokens":') == _int_after_by_hand(
            data, b'"cached_tokens":'), data
