"""The async HTTP load client: send one OpenAI request, time it, classify how it ended.

One `aiohttp.ClientSession` (keep-alive pool, no per-request connection setup) is shared by every
request of a run. A streamed response is read line by line as server-sent events; the clock is
`time.perf_counter`, read when each line arrives:

* TTFT = first *content* chunk (a chat delta with non-empty ``content``, or a completion chunk
  with non-empty ``text``) minus send time; the chat role-only opener does not count.
* ITL = gaps between consecutive content chunks (the replica emits one chunk per token).
* E2E = the end of the body (``[DONE]`` or EOF) minus send time.
* Output tokens = the usage chunk's ``completion_tokens`` when present, else content chunks.

A non-streamed response has TTFT = E2E (the whole body is the first byte a user could read).

Every failure is one `ErrorKind` (string enum, used as a JSON key): ``connect``, ``timeout``,
``http_4xx``, ``http_5xx``, ``stream_error`` (an SSE ``{"error": ...}`` event, e.g. the router's
mid-stream failure), ``protocol`` (a broken body or connection reset mid-response), and
``deadline`` (cancelled by the run's hard deadline). A request that ended in an error keeps the
timings it got so far but is never counted in latency percentiles.

Cost: O(body) JSON decoding per request; one ``json.loads`` per SSE event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import aiohttp

__all__ = ["REPLICA_HEADERS", "ErrorKind", "Outcome", "new_session", "send"]

# Which replica served a request: the router's header, else the replica's own (direct / nginx).
REPLICA_HEADERS = ("x-prefix-router-replica", "x-replica-name")


class ErrorKind(StrEnum):
    CONNECT = "connect"
    TIMEOUT = "timeout"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    STREAM_ERROR = "stream_error"
    PROTOCOL = "protocol"
    DEADLINE = "deadline"


@dataclass(frozen=True)
class Outcome:
    """How one request went. Times are seconds; ``start`` is relative to the run's start."""

    idx: int
    start: float
    status: int | None = None
    error: ErrorKind | None = None
    detail: str = ""
    ttft: float | None = None
    e2e: float | None = None
    itl: tuple[float, ...] = ()
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    replica: str | None = None
    group: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {"idx": self.idx, "start": self.start, "status": self.status,
                "error": None if self.error is None else str(self.error), "detail": self.detail,
                "ttft": self.ttft, "e2e": self.e2e, "itl": list(self.itl),
                "output_tokens": self.output_tokens, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "replica": self.replica, "group": self.group}


def new_session(limit: int = 0, timeout: float = 300.0) -> aiohttp.ClientSession:
    """A session whose pool never limits the run (limit=0: unbounded) and never decompresses."""
    connector = aiohttp.TCPConnector(limit=limit, force_close=False, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout,
                                                               sock_connect=10.0))


def _replica(headers: Mapping[str, str]) -> str | None:
    for h in REPLICA_HEADERS:
        v = headers.get(h)
        if v:
            return v
    return None


def _content(obj: Mapping[str, Any]) -> str:
    choices = obj.get("choices") or ()
    if not choices:
        return ""
    c = choices[0]
    delta = c.get("delta")
    if isinstance(delta, Mapping):
        return str(delta.get("content") or "")
    return str(c.get("text") or "")


@dataclass
class _Acc:
    """Mutable per-request accumulator (kept out of `Outcome`, which is a frozen value)."""

    t0: float
    first: float | None = None
    last: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    usage: dict[str, Any] | None = None
    stream_error: str | None = None

    def content(self, now: float) -> None:
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.itl.append(now - self.last)
        self.last = now
        self.chunks += 1


async def _read_sse(resp: aiohttp.ClientResponse, acc: _Acc) -> None:
    async for raw in resp.content:
        now = time.perf_counter()
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            obj = json.loads(data)
        except ValueError:
            acc.stream_error = "undecodable SSE event"
            break
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            err = obj["error"]
            acc.stream_error = str(err.get("message", err) if isinstance(err, dict) else err)
            break
        if obj.get("usage"):
            acc.usage = obj["usage"]
        if _content(obj):
            acc.content(now)


async def send(session: aiohttp.ClientSession, url: str, body: bytes, *, idx: int = 0,
               t_origin: float = 0.0, headers: Mapping[str, str] | None = None,
               stream: bool = True, group: str = "",
               request_timeout: float = 300.0) -> Outcome:
    """POST ``body`` to ``url``; never raises except `asyncio.CancelledError`."""
    hdrs = {"content-type": "application/json", **(headers or {})}
    t0 = time.perf_counter()
    start = t0 - t_origin
    acc = _Acc(t0)
    status: int | None = None
    replica: str | None = None
    end: float | None = None
    try:
        async with session.post(url, data=body, headers=hdrs,
                                timeout=aiohttp.ClientTimeout(total=request_timeout)) as resp:
            status = resp.status
            replica = _replica(resp.headers)
            if status >= 400:
                detail = (await resp.read())[:200].decode(errors="replace")
                kind = ErrorKind.HTTP_5XX if status >= 500 else ErrorKind.HTTP_4XX
                return Outcome(idx, start, status, kind, detail, replica=replica, group=group)
            if stream and resp.content_type == "text/event-stream":
                await _read_sse(resp, acc)
            else:
                raw = await resp.read()
                end = time.perf_counter()
                acc.content(end)
                payload = json.loads(raw)
                acc.usage = payload.get("usage") if isinstance(payload, dict) else None
    except asyncio.CancelledError:
        raise
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        return _failed(idx, start, status, ErrorKind.TIMEOUT, exc, acc, replica, group)
    except aiohttp.ClientConnectorError as exc:
        return _failed(idx, start, status, ErrorKind.CONNECT, exc, acc, replica, group)
    except (aiohttp.ClientError, ValueError, OSError) as exc:
        return _failed(idx, start, status, ErrorKind.PROTOCOL, exc, acc, replica, group)
    if end is None:
        end = time.perf_counter()
    usage = acc.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    out = Outcome(idx, start, status, itl=tuple(acc.itl),
                  output_tokens=int(usage.get("completion_tokens") or acc.chunks),
                  prompt_tokens=int(usage.get("prompt_tokens") or 0),
                  cached_tokens=int(details.get("cached_tokens") or 0),
                  replica=replica, group=group)
    if acc.stream_error is not None:
        return replace(out, error=ErrorKind.STREAM_ERROR, detail=acc.stream_error[:200])
    ttft = (acc.first if acc.first is not None else end) - t0
    return replace(out, ttft=ttft, e2e=end - t0)


def _failed(idx: int, start: float, status: int | None, kind: ErrorKind, exc: BaseException,
            acc: _Acc, replica: str | None, group: str) -> Outcome:
    ttft = None if acc.first is None else acc.first - acc.t0
    return Outcome(idx, start, status, kind, f"{type(exc).__name__}: {exc}"[:200], ttft=ttft,
                   itl=tuple(acc.itl), output_tokens=acc.chunks, replica=replica, group=group)
