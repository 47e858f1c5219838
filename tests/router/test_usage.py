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
