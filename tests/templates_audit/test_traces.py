"""traces: every accepted line shape, every bad-line reason, bounded reading, gzip and stdin."""

from __future__ import annotations

import gzip
import io
import json
import random
import sys
from pathlib import Path

import pytest

from templates_audit.model import BadLine
from templates_audit.traces import Record, iter_lines, iter_trace, parse_record

CHAT = {"model": "m", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}

SHAPES = [
    # (line, expected messages' contents or None, expected prompt, expected timestamp)
    (CHAT, ["S", "U"], None, None),  # a plain chat-completions body
    ({"prompt": "P"}, None, "P", None),  # a completions body
    ({"prompt": ["P"]}, None, "P", None),  # completions with a one-element prompt list
    ({"request": CHAT}, ["S", "U"], None, None),  # wrapper under "request"
    ({"body": json.dumps(CHAT)}, ["S", "U"], None, None),  # wrapper holding a JSON string
    ({"input": "raw text"}, None, "raw text", None),  # Langfuse-style input string
    ({"input": CHAT["messages"]}, ["S", "U"], None, None),  # Langfuse-style message list
    ({"input": {"messages": CHAT["messages"]}}, ["S", "U"], None, None),  # input holding a body
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "text", "text": "b"}]}]},
     ["a\nb"], None, None),  # content parts are flattened with newlines, like vLLM
    ({**CHAT, "timestamp": "2024-05-20T10:00:00Z"}, ["S", "U"], None, 1716199200.0),  # ISO time
    ({**CHAT, "created_at": 1716199200}, ["S", "U"], None, 1716199200.0),  # epoch seconds
    ({**CHAT, "time": 1716199200123}, ["S", "U"], None, 1716199200.123),  # epoch milliseconds
    ({"request": CHAT, "timestamp": "1716199200"}, ["S", "U"], None, 1716199200.0),  # wrapper's time
    # OpenAI Responses API: instructions are the system message, input the user's text...
    ({"model": "m", "instructions": "S", "input": "U"}, ["S", "U"], None, None),
    # ... or items: messages (parts flattened) are kept, tool-call items are not messages
    ({"instructions": "S", "input": [{"role": "user", "content": [{"type": "input_text",
                                                                   "text": "U"}]},
                                     {"type": "function_call_output", "output": "x"}]},
     ["S", "U"], None, None),
]


@pytest.mark.parametrize(("obj", "contents", "prompt", "ts"), SHAPES)
def test_accepted_shapes(obj: object, contents: list[str] | None, prompt: str | None,
                         ts: float | None) -> None:
    rec = parse_record(json.dumps(obj).encode(), "f", 3)
    assert (rec.file, rec.line) == ("f", 3)
    assert ([m["content"] for m in rec.messages] if rec.messages else None) == contents
    assert rec.prompt == prompt
    assert rec.timestamp == pytest.approx(ts) if ts is not None else rec.timestamp is None


def _deep(n: int) -> bytes:
    return ("[" * n + "]" * n).encode()


BAD = [
    (b"{not json", "invalid JSON"),  # syntax error
    (b"\xff\xfe{}", "invalid UTF-8"),  # undecodable bytes
    (b"[1, 2]", "expected a JSON object"),  # not an object
    (b'{"x": 1}', "no recognisable request"),  # an object that is no request
    (b'{"messages": []}', "empty 'messages'"),  # nothing to render
    (b'{"messages": [{"content": "x"}]}', "without a string 'role'"),  # malformed message
    (b'{"messages": ' + _deep(100) + b"}", "nested deeper"),  # beyond max_depth
    (_deep(100_000), "nested deeper"),  # beyond Python's own recursion limit
]


@pytest.mark.parametrize(("raw", "error"), BAD)
def test_bad_lines_are_reported_with_a_reason(raw: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_record(raw, "f", 1, max_depth=64)


class _Chunky(io.BytesIO):
    """Records the largest chunk ever handed out, to prove a long line is never held whole."""

    largest = 0

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        chunk = super().readline(size)
        self.largest = max(self.largest, len(chunk))
        return chunk


LINES = [
    # (stream content, limit, expected (lineno, bytes|None) pairs)
    (b"a\nb\n", 10, [(1, b"a"), (2, b"b")]),  # plain lines
    (b"a\nb", 10, [(1, b"a"), (2, b"b")]),  # last line without newline
    (b"x" * 10 + b"\nok\n", 10, [(1, b"x" * 10), (2, b"ok")]),  # exactly the limit still fits
    (b"x" * 11 + b"\nok\n", 10, [(1, None), (2, b"ok")]),  # one byte over: skipped, next line read
    (b"x" * 5000 + b"\nok", 10, [(1, None), (2, b"ok")]),  # far over: skipped in chunks
    (b"x" * 5000, 10, [(1, None)]),  # over-long last line without newline
]


@pytest.mark.parametrize(("content", "limit", "expected"), LINES)
def test_iter_lines_bounds_memory(content: bytes, limit: int, expected: list[tuple[int, bytes | None]]) -> None:
    stream = _Chunky(content)
    assert list(iter_lines(stream, limit)) == expected
    assert stream.largest <= limit + 1


def test_iter_trace_reads_gzip_plain_and_unreadable_files(tmp_path: Path) -> None:
    plain = tmp_path / "a.jsonl"
    plain.write_text(json.dumps(CHAT) + "\n\nnot json\n")
    packed = tmp_path / "b.jsonl.gz"
    with gzip.open(packed, "wt") as fh:
        fh.write(json.dumps({"prompt": "P"}) + "\n")
    items = list(iter_trace([str(plain), str(packed), str(tmp_path / "missing.jsonl")]))
    assert isinstance(items[0], Record) and items[0].messages is not None
    bad = items[1]
    assert isinstance(bad, BadLine) and (bad.file, bad.line) == (str(plain), 3)  # blank line 2 skipped
    assert isinstance(items[2], Record) and items[2].prompt == "P"
    assert isinstance(items[3], BadLine) and items[3].line == 0 and "cannot read" in items[3].error


def test_iter_trace_reads_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = io.TextIOWrapper(io.BytesIO(json.dumps(CHAT).encode() + b"\n"))
    monkeypatch.setattr(sys, "stdin", fake)
    [rec] = list(iter_trace(["-"]))
    assert isinstance(rec, Record) and rec.file == "<stdin>"


def test_over_long_line_is_a_bad_line_with_its_number(tmp_path: Path) -> None:
    f = tmp_path / "big.jsonl"
    f.write_bytes(json.dumps(CHAT).encode() + b"\n" + b"x" * 4096 + b"\n" + json.dumps(CHAT).encode())
    items = list(iter_trace([str(f)], max_line_bytes=1024))
    assert [type(i).__name__ for i in items] == ["Record", "BadLine", "Record"]
    assert items[1].line == 2 and "longer than 1024" in items[1].error  # type: ignore[union-attr]


def test_more_brackets_equals_counting() -> None:
    from templates_audit.traces import _more_brackets

    rng = random.Random(3)
    for _ in range(3000):
        raw = bytes(rng.choice(b"[{}]a\"\\ ") for _ in range(rng.randrange(0, 200)))
        limit = rng.randrange(0, 40)
        assert _more_brackets(raw, limit) == (raw.count(b"[") + raw.count(b"{") > limit)
