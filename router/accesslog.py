"""One JSON line per proxied request, written to stdout in batches.

Fields: method, path (without the query string), status, replica, branch, key_source, attempts,
ttfb_ms, duration_ms, bytes_in, bytes_out, model (the metric label: a served model's name or
``unknown``, never the client's string as such), and `limit` on a line that a connection-level
limit wrote (`router/limits.py`: the dotted setting that refused the request, e.g.
`limits.header_timeout`; such a line has method and path `-` when the head was not complete);
with tracing on also trace_id and span_id (hex, of the request's SERVER span: the line and the
trace find each other). Never the body, prompt text, headers or tokens: the record type has no
field that could hold them. Status 499 marks a client that went away.

Cost: the access log is on every request's path, so it does not go through `logging` (a
`LogRecord` per request plus the handler chain measured ~120 us of router CPU per request on the
benchmark machine, ~15 % of the total; see docs/router.md). `AccessLog.emit` encodes the line with
a prebuilt encoder and appends it to a list; `flush()` - called by the app once a second, when
~64 KiB are pending, and at shutdown - writes the lines. A line is therefore at most ~1 s late.

Writes are whole lines in pieces of at most `PIPE_BUF` (4096) bytes, each written and flushed on
its own: container runtimes collect stdout through a pipe, where such writes are atomic, so the
lines of several `--workers` processes sharing the pipe never interleave mid-line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

__all__ = ["AccessLog", "AccessRecord", "CLIENT_CLOSED", "PIPE_BUF", "encode"]

CLIENT_CLOSED = 499
PIPE_BUF = 4096
_FLUSH_AT = 64 * 1024

_ENCODER = json.JSONEncoder(separators=(",", ":"))


@dataclass(slots=True)
class AccessRecord:
    method: str
    path: str
    status: int = 0
    replica: str | None = None
    branch: str | None = None
    key_source: str | None = None
    attempts: int = 0
    ttfb_ms: float | None = None
    duration_ms: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    model: str = "unknown"
    trace_id: str | None = None  # set by router.tracing when tracing is on
    span_id: str | None = None
    limit: str | None = None
    # a disaggregated request (router.disagg): the prefill phase's replica and branch; then
    # `replica` is the decode instance and `branch` decode_load
    prefill_replica: str | None = None
    prefill_branch: str | None = None


def encode(record: AccessRecord) -> str:
    # a literal dict: dataclasses.asdict deep-copies and costs several times more
    line: dict[str, object] = {
        "method": record.method, "path": record.path, "status": record.status,
        "replica": record.replica, "branch": record.branch, "key_source": record.key_source,
        "attempts": record.attempts, "ttfb_ms": record.ttfb_ms,
        "duration_ms": record.duration_ms, "bytes_in": record.bytes_in,
        "bytes_out": record.bytes_out, "model": record.model}
    if record.limit is not None:
        line["limit"] = record.limit
    if record.prefill_replica is not None:
        line["prefill_replica"] = record.prefill_replica
        line["prefill_branch"] = record.prefill_branch
    if record.trace_id is not None:
        line["trace_id"] = record.trace_id
        line["span_id"] = record.span_id
    return _ENCODER.encode(line)


def _stdout() -> TextIO:
    return sys.stdout  # looked up at write time, so redirection (and pytest's capsys) applies


class AccessLog:
    """Buffered JSON-lines writer; `stream` returns the text stream to write to."""

    def __init__(self, stream: Callable[[], TextIO] = _stdout) -> None:
        self._stream = stream
        self._pending: list[str] = []
        self._size = 0

    def emit(self, record: AccessRecord) -> None:
        line = encode(record)
        self._pending.append(line)
        self._size += len(line) + 1
        if self._size >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        lines, self._pending, self._size = self._pending, [], 0
        stream = self._stream()
        piece: list[str] = []
        size = 0
        try:
            for line in lines:
                if piece and size + len(line) + 1 > PIPE_BUF:
                    stream.write("\n".join(piece) + "\n")
                    stream.flush()
                    piece, size = [], 0
                piece.append(line)
                size += len(line) + 1
            stream.write("\n".join(piece) + "\n")
            stream.flush()
        except (OSError, ValueError):  # stdout closed or gone: losing log lines beats crashing
            pass
