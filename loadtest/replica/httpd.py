"""A lean HTTP/1.1 server for one ASGI app: the simulated replica's process server.

Why not uvicorn here: an ``--instant`` replica has to answer several times faster than the router
it is used to measure, and uvicorn's per-request machinery (its request-response cycle, flow
control objects, a task and several dict copies per request, two writes per response) costs more
than the replica's own work on this kind of machine (see docs/simulator.md, "Measured"). This
server keeps only what the replica needs and nothing the router relies on: the router itself and
the tests' in-thread servers still run on uvicorn, and the replica app is plain ASGI either way.

What it does (HTTP/1.1 over asyncio + httptools, the parser uvicorn uses):

* keep-alive and pipelining (requests on one connection are answered in order, one at a time),
  ``Connection: close``, HTTP/1.0, ``Expect: 100-continue``, an idle keep-alive timeout;
* ASGI 3 ``http`` scopes; request bodies are handed to the app as they arrive (reading pauses
  while more than `BODY_HIGH_WATER` bytes wait); ``receive()`` reports ``http.disconnect`` when
  the peer goes away (or once the response is complete), which is what abort-on-disconnect needs;
* responses with ``content-length`` are written as is, others chunked; a response's head is
  written together with its first body message, so a small response is one ``send``; writes wait
  while the transport's buffer is above its high-water mark;
* an exception from the app before the response started becomes a 500; after it started the
  connection is dropped without a terminating chunk (how the replica's "stop mid-stream" fault
  cuts a stream: the app raises), and exceptions listed in ``quiet`` are not logged;
* lifespan startup/shutdown, and a graceful stop: stop accepting, close idle connections, give
  requests in flight ``grace`` seconds, then cancel them and close their connections;
* listening sockets can be closed and re-opened while connections continue (`Server.refuse`,
  `Server.resume`: the replica's refuse-connections fault).

Malformed requests get a 400 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Coroutine, MutableMapping
from typing import Any
from urllib.parse import unquote

import httptools

from prefix_asgi import ASGIApp, advance

log = logging.getLogger("loadtest.replica.httpd")

BODY_HIGH_WATER = 256 * 1024
KEEP_ALIVE_SECONDS = 5.0
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_REASONS = {200: b"OK", 201: b"Created", 204: b"No Content", 400: b"Bad Request",
            401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 413: b"Payload Too Large", 429: b"Too Many Requests",
            500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable",
            504: b"Gateway Timeout"}
_NO_BODY_STATUS = frozenset({204, 304})
_DISCONNECT = {"type": "http.disconnect"}


class _Date:
    """The ``date`` response header, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._value


_date = _Date()


_STATUS_LINES: dict[tuple[str, int], bytes] = {}


def _status_line(version: str, status: int) -> bytes:
    line = _STATUS_LINES.get((version, status))
    if line is None:
        reason = _REASONS.get(status, b"")
        line = b"HTTP/%s %d %s\r\n" % (version.encode("ascii"), status, reason)
        if len(_STATUS_LINES) < 1024:
            _STATUS_LINES[version, status] = line
    return line


class _Exchange:
    """One request on a connection and its response (the ASGI ``receive``/``send`` pair)."""

    __slots__ = (
        "body",
        "body_size",
        "chunked",
        "complete",
        "conn",
        "delivered",
        "disconnected",
        "expect_continue",
        "finished",
        "head",
        "keep_alive",
        "no_body",
        "running",
        "scope",
        "started",
        "task",
        "waiter",
    )

    def __init__(self, conn: _Connection, scope: dict[str, Any], keep_alive: bool,
                 expect_continue: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.body: list[bytes] = []
        self.body_size = 0
        self.complete = False       # the whole request body has arrived
        self.waiter: asyncio.Future[None] | None = None
        self.started = False        # http.response.start seen
        self.finished = False       # the last body message was written
        self.chunked = False
        self.head = b""             # status line + headers, written with the first body
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.task: asyncio.Task[None] | None = None
        self.no_body = scope["method"] == "HEAD"
        self.disconnected = False
        self.delivered = False      # the last body message was handed to the app
        self.running = False        # the app has been called

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> MutableMapping[str, Any]:
        while not (self.body or self.complete or self.disconnected or self.finished):
            if self.expect_continue:
                self.expect_continue = False
                self.conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        if self.delivered and not (self.disconnected or self.finished):
            # The whole body was handed out: the next event is the peer going away.
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        if self.disconnected or self.finished:
            return _DISCONNECT
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        more = not self.complete
        if more:
            self.body_size = 0
            self.conn.resume_reading()
        else:
            self.delivered = True
        return {"type": "http.request", "body": data, "more_body": more}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            status = int(message["status"])
            if status in _NO_BODY_STATUS:
                self.no_body = True
            parts = [_status_line(self.scope["http_version"], status), _date.header(),
                     b"server: prefix-loadtest\r\n"]
            has_length = False
            for name, value in message.get("headers", ()):
                lname = name.lower()
                if lname == b"content-length":
                    has_length = True
                elif lname == b"connection" and value.lower() == b"close":
                    self.keep_alive = False
                elif lname == b"transfer-encoding":
                    continue
                parts += (name, b": ", value, b"\r\n")
            if not has_length and not self.no_body:
                if self.scope["http_version"] == "1.1":
                    self.chunked = True
                    parts.append(b"transfer-encoding: chunked\r\n")
                else:
                    self.keep_alive = False
            if not self.keep_alive or self.conn.server.stopping:
                self.keep_alive = False
                parts.append(b"connection: close\r\n")
            parts.append(b"\r\n")
            self.head = b"".join(parts)
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started:
            raise RuntimeError("http.response.body before http.response.start")
        if self.finished:
            raise RuntimeError("http.response.body after the response was complete")
        if self.disconnected:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.no_body:
            body = b""
        parts = [self.head] if self.head else []   # the head leaves with the first body
        self.head = b""
        if self.chunked:
            if body:
                parts += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more:
                parts.append(b"0\r\n\r\n")
        elif body:
            parts.append(body)
        if parts:   # one copy at most: a whole instant stream is one write of one buffer
            self.conn.write(parts[0] if len(parts) == 1 else b"".join(parts))
        if not more:
            self.finished = True
            self.wake()
            self.conn.response_done(self)
        elif self.conn.write_paused:
            await self.conn.drain()


async def _resume(coro: Coroutine[Any, Any, None], waiting: asyncio.Future[Any] | None) -> None:
    """Drive `coro` on from where an eager first step (`prefix_asgi.advance`) left it, as a Task
    would: wait for what it waits on, step it again. A cancellation of this wrapper's task while
    it waits on something other than the coroutine's own future is thrown into the coroutine."""
    while True:
        exc: BaseException | None = None
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                await waiting
        except asyncio.CancelledError as cancelled:
            if waiting is None or not waiting.cancelled():
                exc = cancelled
        except BaseException:  # the coroutine re-raises its future's error itself
            pass
        try:
            waiting = advance(coro, exc)
        except StopIteration:
            return


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs one exchange at a time, writes responses.

    An exchange starts once its request is complete (or when its body has to be streamed to
    the app: a body still arriving at the end of a read, ``Expect: 100-continue``), and its
    first step runs at once, inside the read: an instant reply is written before the read
    returns, with no task and no extra event-loop iteration. Only an app that has to wait gets a
    task (`_resume`). So during that first step ``asyncio.current_task()`` is None: an app that
    needs a task there (``asyncio.timeout``, a ``TaskGroup``) must await something first. The
    replica's app does not. A queued (pipelined) exchange starts when the one before it is
    done, whether or not its body has arrived.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client: tuple[str, int] | None = None
        self.sockname: tuple[str, int] | None = None
        self.current: _Exchange | None = None      # being parsed (its body may still arrive)
        self.active: _Exchange | None = None       # being answered (or about to be)
        self.queue: deque[_Exchange] = deque()      # parsed, waiting behind `active`
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect = False         # the request being parsed sent Expect: 100-continue
        self.reading = True
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.requests = 0           # exchanges started (the idle sweep compares it)
        self.swept_requests = 0
        self.idle_seconds = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.sockname = (str(sock[0]), int(sock[1])) if isinstance(sock, tuple) else None
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._bad_request(b"protocol upgrades are not supported")
            return
        except httptools.HttpParserError:
            self._bad_request(b"invalid HTTP request")
            return
        ex = self.active
        if ex is not None and not ex.running and not self.closed:
            self._launch(ex)   # its body is still arriving: let the app read it as it comes

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for ex in (self.active, self.current, *self.queue):
            if ex is not None:
                ex.disconnected = True
                ex.wake()
        self.queue.clear()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect":
            self.expect = value.lower() == b"100-continue"
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        method = parser.get_method().decode("ascii")
        url = self.url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url and b"#" not in url:
            raw_path, query = url, b""   # the common case, without a URL parser
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
        path = raw_path.decode("ascii", "replace")
        if "%" in path:
            path = unquote(path)
        scope = {"type": "http", "asgi": _ASGI, "http_version": version, "method": method,
                 "scheme": "http", "path": path, "raw_path": raw_path,
                 "query_string": query, "root_path": "",
                 "headers": self.headers, "client": self.client, "server": self.sockname}
        expect = self.expect and version == "1.1"
        keep_alive = parser.should_keep_alive() and not self.server.stopping
        ex = _Exchange(self, scope, keep_alive, expect)
        self.current = ex
        if self.active is None:
            self.active = ex
            if expect:
                self._launch(ex)    # the client waits for our 100 before sending the body
        else:
            ex.expect_continue = False  # its turn comes later; the client just sends
            self.queue.append(ex)

    def on_body(self, body: bytes) -> None:
        ex = self.current
        if ex is None or ex.disconnected:
            return
        ex.body.append(body)
        ex.body_size += len(body)
        if ex.body_size > BODY_HIGH_WATER:
            self.pause_reading()
        ex.wake()

    def on_message_complete(self) -> None:
        ex = self.current
        if ex is None:
            return
        self.current = None
        ex.complete = True
        if ex.running:
            ex.wake()
        elif ex is self.active:
            self._launch(ex)

    # -- exchanges -------------------------------------------------------------------------------
    def _launch(self, ex: _Exchange) -> None:
        """Run the app for `ex`: its first step now, the rest (if it waits) in a task. Every
        path that may start an exchange calls this; it starts each at most once."""
        if ex.running or self.closed:
            return
        ex.running = True
        self.requests += 1
        coro = self._run(ex)
        try:
            waiting = advance(coro)
        except StopIteration:
            return
        task = ex.task = self.loop.create_task(_resume(coro, waiting))
        tasks = self.server.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, ex: _Exchange) -> None:
        try:
            await self.server.app(ex.scope, ex.receive, ex.send)
        except asyncio.CancelledError:
            self._close()
            raise
        except BaseException as exc:  # every app failure ends here, logged once
            if not isinstance(exc, self.server.quiet):
                log.error("exception in the ASGI app", exc_info=exc)
            if not ex.started and not ex.disconnected:
                self._error_response(ex)
            else:
                self._close()
            return
        if ex.disconnected:
            return
        if not ex.started:
            log.error("the ASGI app returned without starting a response")
            self._error_response(ex)
        elif not ex.finished:
            log.error("the ASGI app returned with its response incomplete")
            self._close()

    def _error_response(self, ex: _Exchange) -> None:
        self._plain_and_close(ex.scope["http_version"], 500, b"Internal Server Error")

    def _plain_and_close(self, version: str, status: int, body: bytes) -> None:
        """A text/plain response that ends the connection."""
        self.write(_status_line(version, status) + _date.header()
                   + b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n%s" % (len(body), body))
        self._close()

    def response_done(self, ex: _Exchange) -> None:
        """Called by `ex.send` once the last body message is written."""
        if not ex.keep_alive or not ex.complete:
            # The request body was not read to the end (or the client asked): the framing of
            # the connection is lost, or it was meant to end here.
            self._close()
            return
        self.active = None
        if self.queue:
            # Pipelined requests: the next one starts on the next loop iteration (no recursion),
            # complete or not: a body still arriving (reading may be paused at the high water
            # mark) is streamed to the app, whose reads resume the transport.
            nxt = self.active = self.queue.popleft()
            self.loop.call_soon(self._launch, nxt)
        elif self.server.stopping:
            self._close()
        else:
            self.resume_reading()

    # -- transport helpers -----------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        if self.write_paused and not self.closed:
            self.drain_waiter = self.loop.create_future()
            await self.drain_waiter

    def pause_reading(self) -> None:
        if self.reading and self.transport is not None and not self.closed:
            self.reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.reading and self.transport is not None and not self.closed:
            self.reading = True
            self.transport.resume_reading()

    def _bad_request(self, reason: bytes) -> None:
        if self.active is None or not self.active.started or self.active.finished:
            self._plain_and_close("1.1", 400, reason)  # the request's version may be unknown
        else:
            self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    @property
    def idle(self) -> bool:
        return self.active is None and self.current is None

    def sweep(self) -> None:
        """Called once a second: closes the connection after `KEEP_ALIVE_SECONDS` idle."""
        if not self.idle or self.requests != self.swept_requests:
            self.swept_requests = self.requests
            self.idle_seconds = 0
            return
        self.idle_seconds += 1
        if self.idle_seconds >= KEEP_ALIVE_SECONDS:
            self._close()

    def shutdown(self) -> None:
        """Server stopping: close now if idle, else after the response in progress."""
        if self.idle:
            self._close()


class Server:
    """Serves `app` on already-bound sockets until SIGINT/SIGTERM (or `stop()`)."""

    def __init__(self, app: ASGIApp, *, grace: float = 2.0,
                 quiet: tuple[type[BaseException], ...] = ()) -> None:
        self.app = app
        self.grace = grace
        self.quiet = quiet
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by serve()
        self.servers: list[asyncio.AbstractServer] = []
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self._stop: asyncio.Event | None = None
        self.stopped_by: int | None = None     # the signal that stopped it
        self.started = False                   # listening

    # -- listening -------------------------------------------------------------------------------
    def _protocol(self) -> _Connection:
        return _Connection(self)

    async def _create_server(self, sock: socket.socket) -> asyncio.AbstractServer:
        return await self.loop.create_server(self._protocol, sock=sock, backlog=2048)

    async def listen(self, sock: socket.socket) -> None:
        self.servers.append(await self._create_server(sock))

    def refuse(self, index: int = 0) -> None:
        """Stop listening on socket `index`; connections already accepted continue."""
        self.servers[index].close()

    async def resume(self, index: int, sock: socket.socket) -> None:
        """Listen again at `index`, on a freshly bound socket `sock`."""
        self.servers[index] = await self._create_server(sock)

    # -- running ---------------------------------------------------------------------------------
    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _on_signal(self, sig: int) -> None:
        self.stopped_by = sig
        self.stop()

    async def serve(self, sockets: list[socket.socket]) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        lifespan = _Lifespan(self.app)
        await lifespan.startup()
        for sock in sockets:
            await self.listen(sock)
        self.started = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self.loop.add_signal_handler(sig, self._on_signal, sig)
        sweeper = self.loop.create_task(self._sweep())
        try:
            await self._stop.wait()
        finally:
            sweeper.cancel()
            await self._shutdown()
            await lifespan.shutdown()

    async def _sweep(self) -> None:
        """Close keep-alive connections left idle (one timer for all, none per request)."""
        while True:
            await asyncio.sleep(1.0)
            for conn in list(self.connections):
                conn.sweep()

    async def _shutdown(self) -> None:
        self.stopping = True
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            conn.shutdown()
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=self.grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        for conn in list(self.connections):
            conn._close()


class _Lifespan:
    """The ASGI lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.done: dict[str, asyncio.Future[None]] = {}
        self.task: asyncio.Task[None] | None = None

    async def _receive(self) -> dict[str, str]:
        return await self.inbox.get()

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        for phase in ("startup", "shutdown"):
            if kind.startswith(f"lifespan.{phase}."):
                fut = self.done.get(phase)
                if fut is not None and not fut.done():
                    if kind.endswith(".failed"):
                        fut.set_exception(RuntimeError(message.get("message", f"{phase} failed")))
                    else:
                        fut.set_result(None)

    async def _phase(self, phase: str) -> None:
        fut = self.done[phase] = asyncio.get_running_loop().create_future()
        await self.inbox.put({"type": f"lifespan.{phase}"})
        assert self.task is not None
        await asyncio.wait({fut, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if fut.done():
            fut.result()
        elif self.task.done() and self.task.exception() is not None:
            raise RuntimeError(f"lifespan {phase} failed") from self.task.exception()

    async def startup(self) -> None:
        self.task = asyncio.ensure_future(
            self.app({"type": "lifespan", "asgi": _ASGI}, self._receive, self._send))
        await self._phase("startup")

    async def shutdown(self) -> None:
        if self.task is None or self.task.done():
            return
        await self._phase("shutdown")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.task, timeout=5)


def run(server: Server, sockets: list[socket.socket]) -> None:
    """Serve until SIGINT/SIGTERM in a fresh event loop (uvloop when installed).

    After a clean stop on a signal the process re-raises that signal with its default action,
    so the exit status says how it ended (as uvicorn does).
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop on Linux/macOS
        asyncio.run(server.serve(sockets))
    else:
        uvloop.run(server.serve(sockets))
    if server.stopped_by is not None:
        signal.signal(server.stopped_by, signal.SIG_DFL)
        os.kill(os.getpid(), server.stopped_by)
