"""The proxy's HTTP/1.1 client to the replicas: pooled keep-alive connections, one exchange at a
time on each, the response body handed over as it is parsed.

aiohttp's ClientSession does far more per request than a proxy needs (a request object, a
header multidict, a payload registry lookup, a writer task, a timer context, a stream reader),
and on the router's hot path that was the largest single cost after the event loop itself. This
client does only what `router.proxy` uses; the control plane (probes, scrapes, /v1/models) keeps
aiohttp.

Exchange (`UpstreamPool.request`):

1. a pooled connection to the replica's (host, port) - the most recently used idle one that
   has been idle less than `keepalive` seconds (older ones are closed when met, so one is never
   reused just as the replica's own keep-alive closes it) - else a new TCP connection, within
   `connect_timeout`;
2. the request head - request line, ``Host``, the given headers, ``Content-Length`` of the body
   (``0`` for a body-less method other than GET/HEAD) - and the body in one write (one buffer,
   head and body joined, up to `_JOIN_MAX` bytes of body: the transport's plain send() path);
3. the response head within `read_timeout` (httptools/llhttp parses it; 1xx heads are skipped);
   `Response.read_chunk` then returns the body as it arrives: everything parsed so far, joined
   (chunked transfer decoded, Content-Length or read-until-close framing), b"" at the end.

A connection returns to the pool (`Response.release`) only when its response was read to the
end, the replica allowed keep-alive and the request was not HEAD; every other ending
(`Response.close`, a failure, a cancellation) closes it, so a replica that was still generating
sees the disconnect and aborts. Reading pauses while more than `HIGH_WATER` bytes are parsed
but not yet taken, so a slow client holds back the replica instead of filling router memory.

Errors are the aiohttp exception types of the same situations, so `errors.translate_upstream`
keeps one mapping: connect failure `ClientConnectionError` (timeout `ConnectionTimeoutError`);
no head or body byte within its read timeout `SocketTimeoutError`; the connection closing or
resetting before the head `ServerDisconnectedError`, after it (body incomplete)
`ClientPayloadError`, as is a response llhttp cannot parse. `Response.set_exception` fails
the pending and later reads (the proxy's idle watchdog).

Read timeouts: one timer per connection (`_Connection.deadline`), kept across waits and
exchanges, fails the pending wait once its deadline passed and re-arms itself for a later one.

Cost per exchange on a reused connection: one write, the parser's callbacks per read (a few per
response), one future per wait, a deadline (a clock read) per timed wait and no timer while
the connection's timer is still armed; no task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from typing import NamedTuple, cast

import aiohttp
import httptools

__all__ = ["HIGH_WATER", "Origin", "Response", "UpstreamPool", "origin_of"]

HIGH_WATER = 256 * 1024  # parsed body bytes not yet read beyond which reading pauses
# a request body up to this size is sent in one buffer with its head: the transport's
# single-buffer write is a plain send(), two buffers take its scatter-gather path
_JOIN_MAX = 64 * 1024
_NO_DEFAULT_LENGTH = frozenset({"GET", "HEAD"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    """Where a replica listens: the pool key, and the request's ``Host`` value."""

    scheme: str
    host: str
    port: int
    host_header: bytes


def origin_of(scheme: str, host: str, port: int | None) -> Origin:
    """The origin of a URL's parts (``port`` None: the scheme's default)."""
    default = _DEFAULT_PORTS.get(scheme, 80)
    port = port or default
    name = f"[{host}]" if ":" in host else host
    value = (name if port == default else f"{name}:{port}").encode("idna")
    return Origin(scheme, host, port, value)


class Response:
    """One response: status and raw headers once the head arrived, then the body by
    `read_chunk`. Exactly one reader at a time (the proxy's relay)."""

    __slots__ = ("_chunks", "_conn", "_done", "_exc", "_head", "_loop", "_size", "_waiter",
                 "content_type", "headers", "keep_alive", "status")

    def __init__(self, conn: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False  # the whole body was parsed
        self._head = False  # a final (non-1xx) head was parsed
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_type = ""
        self.keep_alive = False

    # parser side --------------------------------------------------------------------------

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        """Fail the pending read and every later one with ``exc`` (the first one set wins)."""
        if self._exc is None:
            self._exc = exc
        w = self._waiter
        if w is not None and not w.done():
            w.set_exception(exc)

    # reader side --------------------------------------------------------------------------

    async def _wait(self, limit: float | None) -> None:
        w = self._waiter = self._loop.create_future()
        if limit is not None:
            self._conn.deadline(w, limit)
        try:
            await w
        finally:
            self._waiter = None

    async def head(self, limit: float | None) -> None:
        """Wait for the response head (status and headers set), each wait for bytes at most
        ``limit`` seconds."""
        while not self._head:
            if self._exc is not None:
                raise self._exc
            await self._wait(limit)

    async def read_chunk(self, limit: float | None = None) -> bytes:
        """The body bytes parsed since the last call (waiting up to ``limit`` seconds for
        some), b"" once the body ended."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._done:
                return b""
            await self._wait(limit)
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        if self._size > HIGH_WATER:
            self._conn.resume()
        self._size = 0
        return data

    async def read(self, limit: float | None = None) -> bytes:
        """The rest of the body (each wait for bytes at most ``limit`` seconds)."""
        parts = []
        while chunk := await self.read_chunk(limit):
            parts.append(chunk)
        return b"".join(parts)

    def is_eof(self) -> bool:
        """The body ended and every byte of it was read."""
        return self._done and not self._chunks and self._exc is None

    def release(self) -> None:
        """Done with the response: its connection back to the pool when reusable, else
        closed."""
        conn = self._conn
        if self.is_eof() and self.keep_alive:
            conn.idle()
        else:
            conn.close()

    def close(self) -> None:
        self._conn.close()


class _Connection(asyncio.Protocol):
    """One TCP connection to a replica and the response being read on it (if any)."""

    def __init__(self, pool: UpstreamPool, key: Origin) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.resp: Response | None = None
        self.head_only = False
        self.until_close = False
        self.idle_since = 0.0
        self.closed = False
        self.paused = False
        # the timed wait (`deadline`): its future, limit and deadline, and the one timer that
        # checks it, kept across waits and exchanges (re-armed only when it fired early)
        self._timed: asyncio.Future[None] | None = None
        self._limit = 0.0
        self._at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    # asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None or self.parser is None:  # bytes nobody asked for: not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp.set_exception(aiohttp.ClientPayloadError(f"invalid HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.resp
        if resp is None:
            return
        if not resp._head:
            resp.set_exception(aiohttp.ServerDisconnectedError(
                "the replica closed the connection before the response head"))
        elif not resp._done:
            if self.until_close and exc is None:
                resp._done = True
                resp._wake()
            else:
                resp.set_exception(aiohttp.ClientPayloadError(
                    "the replica closed the connection before the end of the response body"))

    # httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        self.resp.headers.append((name, value))

    def on_headers_complete(self) -> None:
        resp = self.resp
        parser = self.parser
        assert resp is not None and parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200:  # an informational head: the final one follows
            resp.headers = []
            return
        resp.status = status
        resp.keep_alive = parser.should_keep_alive() and not self.head_only
        chunked = length = False
        for name, value in resp.headers:
            lname = name.lower()
            if lname == b"content-type":
                resp.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
            elif lname == b"content-length":
                length = True
            elif lname == b"transfer-encoding":
                chunked = True
        no_body = self.head_only or status in (204, 304)
        self.until_close = not (chunked or length or no_body)
        resp._head = True
        if no_body:
            resp._done = True
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        assert resp is not None
        if not resp._done:
            resp._feed(body)

    def on_message_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        if resp._head and not resp._done:
            resp._done = True
            resp._wake()

    # pool side ----------------------------------------------------------------------------

    def deadline(self, w: asyncio.Future[None], limit: float) -> None:
        """Fail ``w`` with SocketTimeoutError unless it is done within ``limit`` seconds.

        One timer per connection instead of one per wait: a wait sets the deadline; the timer,
        when it fires, fails the current wait if its deadline passed, re-arms itself for it
        if not, and stops when no wait is pending. A new timer is needed only when none is
        armed or the armed one would fire after the new deadline."""
        loop = self.pool.loop
        at = loop.time() + limit
        self._timed, self._limit, self._at = w, limit, at
        timer = self._timer
        if timer is None or self._timer_at > at:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(at, self._expire)
            self._timer_at = at

    def _expire(self) -> None:
        self._timer = None
        w = self._timed
        if w is None or w.done():
            self._timed = None
            return
        if self.pool.loop.time() >= self._at:
            self._timed = None
            w.set_exception(aiohttp.SocketTimeoutError(f"no data for {self._limit:g} s"))
        else:
            self._timer = self.pool.loop.call_at(self._at, self._expire)
            self._timer_at = self._at

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def start(self, head: bytes, body: bytes | None, head_only: bool) -> Response:
        loop = self.pool.loop
        resp = self.resp = Response(self, loop)
        self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only
        self.until_close = False
        assert self.transport is not None
        if not body:
            self.transport.write(head)
        elif len(body) <= _JOIN_MAX:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))
        return resp

    def idle(self) -> None:
        self.resp = None
        self.parser = None
        if self.closed:
            return
        self.resume()
        self.idle_since = self.pool.loop.time()
        self.pool._put(self)

    def close(self) -> None:
        self.resp = None
        self.parser = None
        self._timed = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class UpstreamPool:
    """Keep-alive connections by origin; created and closed in the app's lifespan."""

    def __init__(self, keepalive: float = 4.0) -> None:
        self.keepalive = keepalive
        self.loop = asyncio.get_running_loop()
        self._idle: dict[Origin, collections.deque[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    def _get(self, key: Origin) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_ok = self.loop.time() - self.keepalive
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.idle_since > oldest_ok:
                return conn
            conn.close()
        return None

    def _put(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = collections.deque()
        oldest_ok = self.loop.time() - self.keepalive
        while idle and (idle[0].closed or idle[0].idle_since <= oldest_ok):
            idle.popleft().close()
        idle.append(conn)

    async def _connect(self, key: Origin, limit: float | None) -> _Connection:
        tls: ssl.SSLContext | None = None
        if key.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(limit):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self, key), key.host, key.port, ssl=tls,
                    server_hostname=key.host if tls is not None else None)
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(
                f"connect to {key.host}:{key.port} timed out after {limit:g} s") from exc
        except OSError as exc:
            raise aiohttp.ClientConnectionError(
                f"cannot connect to {key.host}:{key.port}: {exc}") from exc
        return conn

    async def request(self, origin: Origin, method: str, target: bytes,
                      headers: list[tuple[bytes, bytes]], body: bytes | None, *,
                      connect_timeout: float | None, read_timeout: float | None) -> Response:
        """Send one request (``target``: raw path and query) and wait for its response head.
        ``headers`` must not carry Host, Content-Length or hop-by-hop headers."""
        conn = self._get(origin)
        if conn is None:
            conn = await self._connect(origin, connect_timeout)
        parts = [method.encode("ascii"), b" ", target, b" HTTP/1.1\r\nhost: ",
                 origin.host_header, b"\r\n"]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if body:
            parts += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n")
        elif method not in _NO_DEFAULT_LENGTH:
            parts.append(b"content-length: 0\r\n")
        parts.append(b"\r\n")
        resp = conn.start(b"".join(parts), body, method == "HEAD")
        try:
            await resp.head(read_timeout)
        except BaseException:
            conn.close()
            raise
        return resp

    async def close(self) -> None:
        """Close every idle connection (those in use close as their exchanges end)."""
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        self._idle.clear()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # let the transports run their connection_lost
