"""The replica's lean HTTP/1.1 server (`loadtest.replica.httpd`), over real loopback sockets.

Each test runs a `Server` in a thread on its own event loop in front of a small ASGI app and
talks to it with raw sockets (to see the exact bytes and framing) or httpx.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtest.replica import httpd
from loadtest.replica.process import bind_socket
from tests.conftest import asgi_lifespan, wait_for

Events = list[Any]


class Quiet(Exception):
    pass


class Harness:
    """A `httpd.Server` for `app` on 127.0.0.1, in a thread."""

    def __init__(self, app: Any, run: Callable[..., Any] = asyncio.run, **options: Any) -> None:
        self.sock = bind_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = httpd.Server(app, **options)
        self.thread = threading.Thread(target=lambda: run(self.server.serve([self.sock])),
                                       daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, "the server to listen")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        self.server.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.call(self.server.stop)
            self.thread.join(15)
        assert not self.thread.is_alive()

    def connect(self) -> Conn:
        return Conn(self.port)


@pytest.fixture
def serve() -> Iterator[Callable[..., Harness]]:
    started: list[Harness] = []

    def start(app: Any, run: Callable[..., Any] = asyncio.run, **options: Any) -> Harness:
        h = Harness(app, run, **options)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


class Conn:
    """A raw client connection that reads responses off the wire, keeping what is left over."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"connection closed mid-response: {self.buf!r}"
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self, sep: bytes = b"\r\n") -> bytes:
        while sep not in self.buf:
            self._fill()
        out, self.buf = self.buf.split(sep, 1)
        return out

    def response(self) -> tuple[bytes, dict[bytes, bytes], bytes]:
        """One response: (status line, headers, decoded body)."""
        status, *lines = self._line(b"\r\n\r\n").split(b"\r\n")
        headers = {k.lower(): v for k, v in (line.split(b": ", 1) for line in lines)}
        if b"content-length" in headers:
            return status, headers, self._take(int(headers[b"content-length"]))
        assert headers.get(b"transfer-encoding") == b"chunked"
        body = b""
        while size := int(self._line(), 16):
            body += self._take(size)
            assert self._take(2) == b"\r\n"
        assert self._take(2) == b"\r\n"
        return status, headers, body

    def rest(self) -> bytes:
        """Everything until the server closes the connection."""
        while chunk := self.sock.recv(65536):
            self.buf += chunk
        out, self.buf = self.buf, b""
        return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers with the method, path, query and body length; lifespan is acknowledged."""
    if scope["type"] == "lifespan":
        return await asgi_lifespan(receive, send)
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = b"%s %s %s %d" % (scope["method"].encode(), scope["path"].encode(),
                            scope["query_string"], len(body))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def request(path: str = "/x", body: bytes = b"", extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (b"POST %s HTTP/%s\r\nhost: t\r\ncontent-length: %d\r\n%s\r\n%s"
            % (path.encode(), version, len(body), extra, body))


def test_keep_alive_serves_requests_in_turn_on_one_connection(serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    with h.connect() as s:
        for i in range(3):
            s.send(request(f"/r{i}?q={i}", b"a" * i))
            status, headers, body = s.response()
            assert status == b"HTTP/1.1 200 OK"
            assert body == b"POST /r%d q=%d %d" % (i, i, i)
            assert b"connection" not in headers and b"date" in headers


def test_pipelined_requests_are_answered_in_order(serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    with h.connect() as c:
        c.send(b"".join(request(f"/p{i}", b"x" * i) for i in range(5)))
        bodies = [c.response()[2] for _ in range(5)]
        assert bodies == [b"POST /p%d  %d" % (i, i) for i in range(5)]


def test_pipelined_requests_wait_behind_a_slow_one(serve: Callable[..., Harness]) -> None:
    async def slow_first(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/p0":
            await asyncio.sleep(0.2)   # the next requests are parsed and queued meanwhile
        await echo(scope, receive, send)

    h = serve(slow_first)
    with h.connect() as c:
        c.send(b"".join(request(f"/p{i}", b"y" * i) for i in range(4)))
        assert [c.response()[2] for _ in range(4)] == [b"POST /p%d  %d" % (i, i) for i in range(4)]
        c.send(request("/after"))   # the connection is still in step
        assert c.response()[2] == b"POST /after  0"


def _runners() -> list[Any]:
    out: list[Any] = [pytest.param(asyncio.run, id="asyncio")]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        return out
    return [*out, pytest.param(uvloop.run, id="uvloop")]


@pytest.mark.parametrize("run", _runners())
def test_a_queued_request_runs_once_when_more_data_arrives_as_it_is_due(
        serve: Callable[..., Harness], run: Callable[..., Any]) -> None:
    """The slow request's response schedules the queued one; a read that arrives before that
    callback (uvloop handles reads first) must not start it a second time."""
    calls: dict[str, int] = {}

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            calls[scope["path"]] = calls.get(scope["path"], 0) + 1
            if scope["path"] == "/slow":
                await asyncio.sleep(0.05)
                time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop on purpose: /three arrives
        await echo(scope, receive, send)

    h = serve(counting, run)
    with h.connect() as c:
        c.send(request("/slow") + request("/two"))
        time.sleep(0.15)
        c.send(request("/three"))
        bodies = [c.response()[2] for _ in range(3)]
    assert bodies == [b"POST /slow  0", b"POST /two  0", b"POST /three  0"]
    assert calls == {"/slow": 1, "/two": 1, "/three": 1}


def test_a_queued_request_with_a_large_body_streams_once_its_turn_comes(
        serve: Callable[..., Harness]) -> None:
    """Its body passes the high-water mark while it waits, which pauses reading; when its turn
    comes it must start (and its reads resume the transport), not wait for a complete body."""
    async def slow_first(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/slow":
            await asyncio.sleep(0.3)
        await echo(scope, receive, send)

    big = b"z" * (4 * httpd.BODY_HIGH_WATER)
    h = serve(slow_first)
    with h.connect() as c:
        c.send(request("/slow"))
        sender = threading.Thread(target=c.send, args=(request("/big", big),), daemon=True)
        sender.start()
        assert c.response()[2] == b"POST /slow  0"
        assert c.response()[2] == b"POST /big  %d" % len(big)
        sender.join(5)


def test_a_body_larger_than_the_read_buffer_streams_to_the_app(
        serve: Callable[..., Harness]) -> None:
    chunks: list[int] = []

    async def count(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await echo(scope, receive, send)
        total = 0
        while True:
            msg = await receive()
            chunks.append(len(msg["body"]))
            total += len(msg["body"])
            if not msg["more_body"]:
                break
        out = str(total).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    h = serve(count)
    size = 3 * httpd.BODY_HIGH_WATER + 123
    r = httpx.post(h.url + "/big", content=b"z" * size, timeout=10)
    assert r.text == str(size)
    assert len(chunks) > 1 and sum(chunks) == size


def test_responses_without_a_length_are_chunked_and_streamed(serve: Callable[..., Harness]) -> None:
    async def stream(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await echo(scope, receive, send)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i,
                        "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})

    h = serve(stream)
    with h.connect() as s:
        s.send(b"GET /s HTTP/1.1\r\nhost: t\r\n\r\n")
        _, headers, body = s.response()
        assert headers[b"transfer-encoding"] == b"chunked"
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    with httpx.stream("GET", h.url + "/s") as r:
        assert list(r.iter_lines()) == ["data: 0", "", "data: 1", "", "data: 2", ""]


def test_http_1_0_and_connection_close_end_the_connection(serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    for req in (request(version=b"1.0"), request(extra=b"connection: close\r\n")):
        with h.connect() as s:
            s.send(req)
            status, headers, body = s.response()
            assert headers[b"connection"] == b"close" and body == b"POST /x  0"
            assert s.rest() == b""   # closed by the server
        assert status.startswith(b"HTTP/1.")


def test_expect_100_continue_gets_a_100_before_the_body_is_sent(
        serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    with h.connect() as s:
        s.send(b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\n"
                  b"expect: 100-continue\r\n\r\n")
        assert s._line(b"\r\n\r\n") == b"HTTP/1.1 100 Continue"
        s.send(b"abcd")
        assert s.response()[2] == b"POST /e  4"


def test_head_responses_carry_no_body(serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    r = httpx.head(h.url + "/h")
    assert r.status_code == 200 and r.content == b""
    assert httpx.get(h.url + "/after").text == "GET /after  0"


def test_percent_encoded_paths_are_decoded_and_raw_path_kept(serve: Callable[..., Harness]) -> None:
    seen: list[tuple[str, bytes]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append((scope["path"], scope["raw_path"]))
        await echo(scope, receive, send)

    h = serve(app)
    assert httpx.get(h.url + "/a%20b").status_code == 200
    assert seen == [("/a b", b"/a%20b")]


def test_malformed_requests_get_400_and_are_closed(serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    for junk in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\ncontent-length: x\r\n\r\n"):
        with h.connect() as s:
            s.send(junk)
            status, headers, _ = s.response()
            assert status.startswith(b"HTTP/1.1 400") and headers[b"connection"] == b"close"
            assert s.rest() == b""
    assert httpx.get(h.url + "/still").status_code == 200


def test_app_errors_before_and_after_the_response_started(
        serve: Callable[..., Harness], caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await echo(scope, receive, send)
        if scope["path"] == "/before":
            raise RuntimeError("boom before")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise (Quiet if scope["path"] == "/quiet" else RuntimeError)("after")

    h = serve(app, quiet=(Quiet,))
    with caplog.at_level(logging.ERROR, logger="loadtest.replica.httpd"):
        r = httpx.get(h.url + "/before")
        assert r.status_code == 500 and r.headers["connection"] == "close"
        for path in ("/after", "/quiet"):
            with h.connect() as s:
                s.send(b"GET %s HTTP/1.1\r\nhost: t\r\n\r\n" % path.encode())
                data = s.rest()
                # The stream is cut: the part is there, the terminating chunk is not.
                assert data.endswith(b"4\r\npart\r\n") and b"0\r\n\r\n" not in data
    logged = [r.getMessage() for r in caplog.records]
    assert logged.count("exception in the ASGI app") == 2   # /before and /after, not /quiet


def test_a_client_that_leaves_is_seen_as_http_disconnect(serve: Callable[..., Harness]) -> None:
    events: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await echo(scope, receive, send)
        assert (await receive())["type"] == "http.request"
        events.append((await receive())["type"])   # waits until the peer goes away

    h = serve(app)
    with h.connect() as s:
        s.send(request("/wait"))
        time.sleep(0.1)
    wait_for(lambda: events == ["http.disconnect"], "the disconnect")


def test_graceful_stop_finishes_short_requests_and_cancels_hung_ones(
        serve: Callable[..., Harness]) -> None:
    log: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                log.append(msg["type"])
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        try:
            await asyncio.sleep(0.3 if scope["path"] == "/short" else 60)
        except asyncio.CancelledError:
            log.append("cancelled " + scope["path"])
            raise
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    h = serve(app, grace=1.0)
    short, hung = h.connect(), h.connect()
    short.send(b"GET /short HTTP/1.1\r\nhost: t\r\n\r\n")
    hung.send(b"GET /hung HTTP/1.1\r\nhost: t\r\n\r\n")
    time.sleep(0.1)
    h.stop()   # returns (and its server thread ended) only once the hung request was cancelled
    _, headers, body = short.response()
    assert body == b"ok" and headers[b"connection"] == b"close"
    assert hung.rest() == b""
    assert log == ["lifespan.startup", "cancelled /hung", "lifespan.shutdown"]
    with pytest.raises(OSError):
        h.connect()


def test_refuse_and_resume_listening_keeps_accepted_connections(
        serve: Callable[..., Harness]) -> None:
    h = serve(echo)
    kept = h.connect()
    kept.send(request("/first"))
    assert kept.response()[2] == b"POST /first  0"   # accepted and served
    h.call(h.server.refuse, 0)
    wait_for(lambda: _refused(h.port), "the listener to close")
    kept.send(request("/kept"))
    assert kept.response()[2] == b"POST /kept  0"

    async def resume() -> None:
        await h.server.resume(0, bind_socket("127.0.0.1", h.port))

    h.call(lambda: asyncio.ensure_future(resume()))
    wait_for(lambda: not _refused(h.port), "the listener to reopen")
    assert httpx.post(h.url + "/again").text == "POST /again  0"
    kept.close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_idle_keep_alive_connections_are_closed(serve: Callable[..., Harness],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd, "KEEP_ALIVE_SECONDS", 1)
    h = serve(echo)
    with h.connect() as s:
        t0 = time.monotonic()   # before the request: the idle timer starts after its answer
        s.send(request())
        s.response()
        s.sock.settimeout(10)
        assert s.rest() == b""
        assert 0.9 <= time.monotonic() - t0   # the keep-alive closed it (else: 10 s timeout)


def test_an_app_that_waits_runs_on_in_a_task_and_sees_errors_of_what_it_awaits(
        serve: Callable[..., Harness]) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await echo(scope, receive, send)
        await asyncio.sleep(0)                    # a bare yield
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_exception, KeyError("k"))
        try:
            await fut
        except KeyError as exc:
            out = repr(exc).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    h = serve(app)
    assert httpx.get(h.url + "/w").text == "KeyError('k')"
