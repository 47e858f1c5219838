"""Read request traces (JSONL, optionally gzip, ``-`` for stdin) into :class:`Record` values.

Accepted line shapes, first match wins:

* an OpenAI chat-completions body (``messages``, optional ``tools``, ``model``);
* a completions body (``prompt``: a string, or a one-element list of strings);
* a wrapper holding one of those under ``request`` or ``body`` (a dict or a JSON string);
* an OpenAI Responses API body: ``instructions`` (the system message) and ``input`` (the user's
  text, or items whose messages are kept);
* a Langfuse-style observation whose ``input`` is a string, a message list or one of the above.

An optional timestamp (``timestamp``, ``created_at``, ``time``, ``start_time``; ISO 8601 or epoch
seconds/milliseconds) is taken from the line or its wrapper.

Bounded memory: files are read in binary with ``readline(limit)``; a line longer than
``max_line_bytes`` is never held whole — the reader skips to the next newline in ``limit``-sized
chunks and reports the line as bad. Every other failure (invalid UTF-8, invalid JSON, nesting
deeper than ``max_depth``, no recognisable request) also becomes a :class:`BadLine`; nothing
aborts the stream. Cost: O(bytes) per line plus one JSON decode (orjson when installed and
certainly equal to ``json.loads``, see `jsonfast`; errors always come from ``json.loads``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from templates_audit.jsonfast import Refused, fast_loads_depth
from templates_audit.model import BadLine

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_LINE_BYTES",
    "Record",
    "iter_lines",
    "iter_trace",
    "parse_record",
]

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH = 64

_WRAPPER_KEYS = ("request", "body")
_TIME_KEYS = ("timestamp", "created_at", "time", "start_time", "startTime")
_GZIP_MAGIC = b"\x1f\x8b"
_READ_BUFFER = 1 << 16


@dataclass(frozen=True, eq=False, init=False)
class Record:
    """One request. Exactly one of ``messages`` (chat) and ``prompt`` (completions) is set.

    ``messages`` are normalised: ``role`` and ``content`` are strings (text parts joined with
    newlines, as vLLM does for string-content templates); other keys are kept.
    """

    file: str
    line: int
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    model: str | None = None
    timestamp: float | None = None

    def __init__(self, file: str, line: int, messages: list[dict[str, Any]] | None = None,
                 tools: list[dict[str, Any]] | None = None, prompt: str | None = None,
                 model: str | None = None, timestamp: float | None = None) -> None:
        # The generated __init__ of a frozen dataclass makes one object.__setattr__ call per
        # field; one is built per request, so the fields are written at once (still frozen).
        self.__dict__.update(file=file, line=line, messages=messages, tools=tools,
                             prompt=prompt, model=model, timestamp=timestamp)


class _Bad(ValueError):
    """A line that is not a request; the message is what the report shows."""


# -- reading ---------------------------------------------------------------------------------------
def iter_lines(stream: IO[bytes], max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(1-based line number, bytes without the newline) — ``None`` for an over-long line."""
    lineno = 0
    readline = stream.readline
    limit = max_line_bytes + 1  # +1: a line of exactly max_line_bytes plus its newline fits
    while True:
        chunk = readline(limit)
        if not chunk:
            return
        lineno += 1
        if chunk.endswith(b"\n"):
            yield lineno, chunk[:-1]
            continue
        if len(chunk) < limit:  # last line without a trailing newline
            yield lineno, chunk
            return
        # Over-long: drop it chunk by chunk so memory stays bounded by the limit.
        while chunk and not chunk.endswith(b"\n"):
            chunk = readline(limit)
        yield lineno, None


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer
        return
    # closed below, possibly through the gzip wrapper; a 64 KiB buffer: prompts are long lines,
    # and the default 8 KiB one costs a read per line
    raw = io.BufferedReader(io.FileIO(path, "rb"), buffer_size=_READ_BUFFER)
    try:
        if path.endswith(".gz") or raw.peek(2)[:2] == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz  # type: ignore[misc]
        else:
            yield raw
    finally:
        raw.close()


def iter_trace(
    paths: Iterable[str],
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[Record | BadLine]:
    """Records and bad lines of all ``paths`` in order. An unreadable file is one bad line (0)."""
    for path in paths:
        name = "<stdin>" if path == "-" else path
        try:
            with _open(path) as stream:
                for lineno, raw in iter_lines(stream, max_line_bytes):
                    if on_bytes is not None:
                        on_bytes(len(raw) + 1 if raw is not None else max_line_bytes)
                    if raw is None:
                        yield BadLine(name, lineno, f"line longer than {max_line_bytes} bytes")
                        continue
                    if not raw or raw.isspace():  # blank line (no copy, unlike strip)
                        continue
                    try:
                        yield parse_record(raw, name, lineno, max_depth=max_depth)
                    except _Bad as exc:
                        yield BadLine(name, lineno, str(exc))
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            yield BadLine(name, 0, f"cannot read: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")


def total_bytes(paths: Iterable[str]) -> int | None:
    """Sum of file sizes, for a progress bar (None when a size is unknown: stdin, gzip)."""
    total = 0
    for p in paths:
        if p == "-" or p.endswith(".gz"):
            return None
        try:
            total += os.path.getsize(p)
        except OSError:
            return None
    return total


# -- parsing ---------------------------------------------------------------------------------------
def parse_record(raw: bytes, file: str = "<input>", line: int = 0, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Record:
    """Parse one JSONL line; raises ``ValueError`` (a private subclass) with the reason."""
    try:
        obj, levels = fast_loads_depth(raw)
        too_deep = levels > max_depth
    except Refused:  # no orjson, or the standard library's answer (value or error) is needed
        obj = _slow_loads(raw, max_depth)
        # Cheap bound first: a line with fewer brackets than the limit cannot nest deeper.
        too_deep = _more_brackets(raw, max_depth) and _too_deep(obj, max_depth)
    if too_deep:
        raise _Bad(f"nested deeper than {max_depth} levels")
    if not isinstance(obj, dict):
        raise _Bad(f"expected a JSON object, got {type(obj).__name__}")
    return _record(obj, file, line, _timestamp(obj), depth=0)


def _slow_loads(raw: bytes, max_depth: int) -> Any:
    """The line's value by json.loads, or `_Bad` with the reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        return _loads(text)
    except RecursionError:
        raise _Bad(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise _Bad(f"invalid JSON: {exc}") from None


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"  # the whitespace json.loads allows around a value


def _loads(text: str) -> Any:
    """``json.loads(text)``: the C scanner called directly when the value starts the line and
    only JSON whitespace follows it; anything else (errors included) goes through json.loads."""
    try:
        obj, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # leading whitespace or invalid: its result or its error
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        return json.loads(text)  # extra data: raise json.loads's own error
    return obj


def _more_brackets(raw: bytes, limit: int) -> bool:
    """``raw.count(b"[") + raw.count(b"{") > limit``, stopping at ``limit + 1``: ``find`` skips
    to each bracket (memchr speed), so a request with a handful of brackets costs a handful
    of calls instead of two byte-by-byte counts of the whole line."""
    n = 0
    for bracket in (b"[", b"{"):
        k = raw.find(bracket)
        while k >= 0:
            n += 1
            if n > limit:
                return True
            k = raw.find(bracket, k + 1)
    return False


def _too_deep(obj: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        cur, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(cur, dict):
            stack.extend((v, depth + 1) for v in cur.values() if isinstance(v, dict | list))
        elif isinstance(cur, list):
            stack.extend((v, depth + 1) for v in cur if isinstance(v, dict | list))
    return False


def _record(obj: dict[str, Any], file: str, line: int, ts: float | None, depth: int) -> Record:
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    messages = obj.get("messages")
    if isinstance(messages, list):
        return Record(file, line, messages=_messages(messages), tools=_tools(obj.get("tools")),
                      model=model, timestamp=ts)
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return Record(file, line, prompt=prompt, model=model, timestamp=ts)
    instructions, inp = obj.get("instructions"), obj.get("input")
    if isinstance(instructions, str) and isinstance(inp, str | list):
        # An OpenAI Responses API body: `instructions` is the system message, `input` the user's
        # text or a list of items, of which the messages (with a role) are rendered.
        items = [{"role": "user", "content": inp}] if isinstance(inp, str) else [
            m for m in inp if isinstance(m, dict) and isinstance(m.get("role"), str)]
        return Record(file, line, messages=_messages([{"role": "system", "content": instructions},
                                                     *items]),
                      tools=_tools(obj.get("tools")), model=model, timestamp=ts)
    if depth < 3:
        for key in (*_WRAPPER_KEYS, "input"):
            inner = obj.get(key)
            if isinstance(inner, str) and key != "input":
                try:
                    inner = json.loads(inner)
                except ValueError:
                    continue
            if isinstance(inner, dict):
                return _record(inner, file, line, ts if ts is not None else _timestamp(inner), depth + 1)
            if key == "input" and isinstance(inner, str):
                return Record(file, line, prompt=inner, model=model, timestamp=ts)
            if key == "input" and isinstance(inner, list) and inner and all(isinstance(m, dict) for m in inner):
                return Record(file, line, messages=_messages(inner), model=model, timestamp=ts)
    raise _Bad("no recognisable request (messages, prompt, request/body wrapper or input)")


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def _messages(raw: list[Any]) -> list[dict[str, Any]]:
    out = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _Bad("a message without a string 'role'")
        msg = dict(m)
        msg["content"] = _text(m.get("content"))
        out.append(msg)
    if not out:
        raise _Bad("empty 'messages'")
    return out


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if isinstance(raw, list) and raw and all(isinstance(t, dict) for t in raw):
        return raw
    return None


def _timestamp(obj: dict[str, Any]) -> float | None:
    for key in _TIME_KEYS:
        if key in obj:
            ts = parse_timestamp(obj[key])
            if ts is not None:
                return ts
    return None


def parse_timestamp(value: Any) -> float | None:
    """Epoch seconds from an ISO 8601 string or epoch seconds/milliseconds/microseconds."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        v = float(value)
    elif isinstance(value, str):
        s = value.strip()
        try:
            v = float(s)
        except ValueError:
            try:
                d = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
            except ValueError:
                return None
            if d.tzinfo is None:
                d = d.replace(tzinfo=dt.UTC)
            return d.timestamp()
    else:
        return None
    # Heuristic units: anything past year ~5000 in seconds is really ms or µs.
    while v > 1e11:
        v /= 1000.0
    return v if v > 0 else None
