"""router.limits on a real uvicorn server (loopback, uvloop, the router's protocol class) in
front of a small ASGI app that carries a ConnectionGuard; raw sockets send what no client
library would. Deadlines are fractions of a second here; assertions are on outcomes (status,
closed or not, counters) with generous upper bounds, never on tight timings."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from router.accesslog import AccessLog
from router.body import ClientGone, read_body
from router.limits import (
    DISCONNECT_HOOK,
    DISCONNECTED,
    ConnectionGuard,
    LimitedHttpToolsProtocol,
    body_deadline,
    refused_by,
)
from router.metrics import RouterMetrics
from router.settings import LimitsSettings
from tests.conftest import ThreadedServer, asgi_lifespan, wait_for

CANARY = "canary-5b1e0c"


class GuardedApp:
    """Reads the body (unless the path is /early: it answers first), answers 200 with its size."""

    def __init__(self, limits: LimitsSettings) -> None:
        self.metrics = RouterMetrics()
        self.log = io.StringIO()
        self.access_log = AccessLog(lambda: self.log)
        self.connection_guard = ConnectionGuard(limits, self.metrics, self.access_log)
        self.refused: list[str | None] = []
        self.answered = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        if scope["path"] == "/early":
            body = b""
        else:
            try:
                body = await read_body(receive, scope["headers"], 64 * 1024 * 1024)
            except ClientGone:
                self.refused.append(refused_by(scope))
                return
        answer = str(len(body)).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})
        self.answered += 1

    def lines(self) -> list[dict[str, Any]]:
        self.access_log.flush()
        return [json.loads(line) for line in self.log.getvalue().splitlines()]

    def rejected(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value("prefix_router_rejected_total",
                                                       {"reason": reason})
        return value or 0.0


# small sizes; deadlines long enough for a loaded machine unless a test sets its own short one
BASE = dict(header_timeout=5.0, body_timeout=5.0, body_min_rate=1024, keepalive_timeout=5.0,
            max_request_line=1024, max_header_count=20, max_header_bytes=2048,
            max_connections=50)


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[GuardedApp, int]]]:
    started: list[ThreadedServer] = []

    def start(**limits: Any) -> tuple[GuardedApp, int]:
        lim = LimitsSettings(**{**BASE, **limits})
        app = GuardedApp(lim)
        srv = ThreadedServer(app, http=LimitedHttpToolsProtocol,
                             timeout_keep_alive=lim.keepalive_timeout).start()
        started.append(srv)
        return app, srv.port

    yield start
    for srv in started:
        srv.stop()


class Client(socket.socket):
    """A client socket that keeps what it received past the response being read: one recv
    can carry several answers (pipelined requests all answered before the client reads)."""

    pending = b""


def connect(port: int, source: str = "127.0.0.1") -> Client:
    s = Client()
    s.bind((source, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def read_all(s: Client) -> bytes:
    """Everything until the server closes (an answer then EOF, or EOF alone)."""
    out, s.pending = s.pending, b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def drip(s: socket.socket, piece: Callable[[int], bytes], every: float, times: int) -> bytes:
    """Send piece(i) every `every` s, up to `times`, until the server closes; what it sent."""
    s.settimeout(every)
    raw = b""
    for i in range(times):
        try:
            s.sendall(piece(i))
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        raw += chunk
    return raw


def read_response(s: Client) -> bytes:
    """One response with a Content-Length (the app's and the guard's answers all have one);
    the bytes after it stay in `s.pending` for the next call. EOF before a whole response
    fails the test at once."""
    raw = s.pending
    while (end := raw.find(b"\r\n\r\n")) < 0:
        raw += _more(s, raw)
    length = int(raw[:end].lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    size = end + 4 + length
    while len(raw) < size:
        raw += _more(s, raw)
    s.pending = raw[size:]
    return raw[:size]


def _more(s: Client, raw: bytes) -> bytes:
    chunk = s.recv(65536)
    if not chunk:
        raise AssertionError(f"the server closed the connection after {raw[:200]!r}")
    return chunk


def status(raw: bytes) -> int | None:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None


def error_code(raw: bytes) -> str:
    return str(json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["code"])


def get(path: str = "/x", headers: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n"


def post_head(length: int) -> bytes:
    return (b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % length)


def headers(n: int, value: bytes = b"v") -> bytes:
    return b"".join(b"X-H%d: %s\r\n" % (i, value) for i in range(n))


SIZE_CASES = [
    # (request, expected status, rejected_total reason or None) - what each row proves
    (get(headers=headers(18)), 200, None),                      # 20 headers (Host + 18 + ...) fit
    (get(headers=headers(20)), 431, "too_many_headers"),        # 21 > max_header_count
    (get(headers=headers(5000)), 431, "too_many_headers"),      # the 5,000 lines
    (get(headers=b"X-Big: " + b"a" * 1900 + b"\r\n"), 200, None),    # under max_header_bytes
    (get(headers=b"X-Big: " + b"a" * 2100 + b"\r\n"), 431, "headers_too_large"),
    (get(headers=headers(10, b"b" * 300)), 431, "headers_too_large"),  # the sum, not one header
    (get(headers=b"X-Big: " + b"a" * 200_000 + b"\r\n"), 431, "headers_too_large"),  # unbuffered
    (get("/" + "p" * 1000), 200, None),                           # request target under 1 KiB
    (get("/" + "p" * 1100), 414, "request_line_too_long"),
    (get("/" + "p" * 100_000), 414, "request_line_too_long"),
]


@pytest.mark.parametrize(("request_bytes", "want", "reason"), SIZE_CASES)
def test_head_sizes(serve: Callable[..., tuple[GuardedApp, int]], request_bytes: bytes,
                    want: int, reason: str | None) -> None:
    app, port = serve()
    with connect(port) as s:
        s.sendall(request_bytes)
        raw = read_response(s) if want == 200 else read_all(s)
    assert status(raw) == want
    if reason is not None:
        assert error_code(raw) == {414: "request_line_too_long",
                                   431: "request_header_fields_too_large"}[want]
        assert b"connection: close" in raw
        assert app.rejected(reason) == 1


def test_head_sent_one_byte_at_a_time_is_measured(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    """A head split over many reads is counted across them (the one-read case is above)."""
    app, port = serve(header_timeout=10.0)
    with connect(port) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        req = get(headers=b"X-Big: " + b"a" * 3000 + b"\r\n")
        for i in range(0, len(req), 500):
            s.sendall(req[i:i + 500])
            time.sleep(0.01)
        raw = read_all(s)
    assert status(raw) == 431 and app.rejected("headers_too_large") == 1


@pytest.mark.parametrize("sent", [b"", b"POST /x HTTP/1.1\r\nHost: t\r\n"])
def test_head_deadline(serve: Callable[..., tuple[GuardedApp, int]], sent: bytes) -> None:
    """Nothing, or a partial head: 408 and closed once header_timeout passed."""
    app, port = serve(header_timeout=0.5)
    t0 = time.monotonic()
    with connect(port) as s:
        s.sendall(sent)
        raw = read_all(s)
    elapsed = time.monotonic() - t0
    assert status(raw) == 408 and error_code(raw) == "request_timeout"
    assert elapsed >= 0.45   # a hang would end in the socket's 10 s timeout instead
    assert app.rejected("header_timeout") == 1
    assert app.lines() == [{**app.lines()[0], "method": "-", "path": "-", "status": 408,
                            "limit": "limits.header_timeout"}]


def test_slowloris_drip_does_not_extend_the_head_deadline(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(header_timeout=1.0)
    with connect(port) as s:
        s.sendall(b"POST /x HTTP/1.1\r\n")
        # one header line every 0.2 s for up to 8 s
        raw = drip(s, lambda i: b"X-Drip-%d: 1\r\n" % i, 0.2, 40)
    assert status(raw) == 408
    assert app.rejected("header_timeout") == 1


def test_head_deadline_on_a_kept_alive_connection(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(keepalive_timeout=30.0, header_timeout=2.0)
    with connect(port) as s:
        s.sendall(get())
        assert status(read_response(s)) == 200
        s.sendall(b"GET /x HTTP/1.1\r\n")   # the next head starts, never ends
        raw = read_all(s)
    assert status(raw) == 408 and app.rejected("header_timeout") == 1


def test_idle_keep_alive_closes_silently(serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(keepalive_timeout=0.3, header_timeout=30.0)
    with connect(port) as s:
        s.sendall(get())
        first = read_response(s)
        rest = read_all(s)   # uvicorn's timeout_keep_alive closes it
    assert status(first) == 200 and rest == b""
    assert app.lines() == []


def test_trickled_body_gets_408_and_the_app_sees_a_disconnect(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(body_timeout=0.5, body_min_rate=1024)
    with connect(port) as s:
        s.sendall(post_head(100_000))
        raw = drip(s, lambda _: b"x", 0.1, 100)   # one byte every 0.1 s for up to 10 s
    assert status(raw) == 408 and error_code(raw) == "request_timeout"
    assert app.rejected("body_timeout") == 1
    # the app learns of the disconnect in its own task, maybe after the client saw the close
    wait_for(lambda: app.refused != [], "the app to see the disconnect")
    assert app.refused == ["limits.body_timeout"]
    (line,) = app.lines()
    assert (line["method"], line["path"], line["limit"]) == ("POST", "/x", "limits.body_timeout")
    assert 1 <= line["bytes_in"] < 100


def test_body_at_the_minimum_rate_outlives_body_timeout(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    """96 KiB at ~32 KiB/s takes ~3 s, three times body_timeout: the rate earns the time
    (a stall of the sender up to ~1 s is still within it)."""
    app, port = serve(body_timeout=1.0, body_min_rate=8 * 1024)
    size = 96 * 1024
    with connect(port) as s:
        s.sendall(post_head(size))
        for _ in range(size // 1024):
            s.sendall(b"y" * 1024)
            time.sleep(1 / 32)
        raw = read_response(s)
    assert status(raw) == 200 and raw.endswith(str(size).encode())
    assert app.rejected("body_timeout") == 0


def test_unread_body_of_an_answered_request_still_has_a_deadline(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    """The app answers without reading (like a 401); the client keeps dripping the body."""
    app, port = serve(body_timeout=0.5, keepalive_timeout=30.0)
    with connect(port) as s:
        s.sendall(post_head(100_000).replace(b"/x", b"/early"))
        raw = drip(s, lambda _: b"z", 0.1, 100)
    assert status(raw) == 200 and raw.count(b"HTTP/1.1") == 1   # no second answer
    assert app.rejected("body_timeout") == 1


def test_pipelined_and_kept_alive_requests_are_served(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve()
    with connect(port) as s:
        s.sendall(post_head(3) + b"abc" + get() + post_head(2) + b"de")
        # all three answers are written before the client reads, so one recv returns them
        # together (what a loaded machine does by chance): each is read, none is lost
        wait_for(lambda: app.answered == 3, "the three pipelined answers")
        answers = [read_response(s) for _ in range(3)]
        assert [status(a) for a in answers] == [200, 200, 200]
        assert [a.rpartition(b"\r\n\r\n")[2] for a in answers] == [b"3", b"0", b"2"]
        for _ in range(20):
            s.sendall(get())
            assert status(read_response(s)) == 200


def test_connection_cap_refuses_at_once(serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(max_connections=5, header_timeout=30.0)
    held = [connect(port) for _ in range(5)]
    try:
        wait_for(lambda: app.connection_guard.open == 5, "all five admitted")
        with connect(port) as s:
            s.sendall(get())
            raw = read_all(s)   # answered and closed: no wait for the socket's timeout
        assert status(raw) == 503 and error_code(raw) == "too_many_connections"
        assert b"retry-after: 1" in raw
        assert app.connection_guard.open == 5
    finally:
        for s in held:
            s.close()
    with connect(port) as s:   # room again
        s.sendall(get(headers=b"Connection: close\r\n"))
        assert status(read_all(s)) == 200
    assert app.rejected("too_many_connections") == 1
    deadline = time.monotonic() + 5
    while app.connection_guard.open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.connection_guard.open == 0
    assert app.metrics.registry.get_sample_value("prefix_router_connections") == 0


def test_per_client_cap(serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(max_connections_per_client=2, header_timeout=30.0)
    held = [connect(port, "127.0.0.2") for _ in range(2)]
    try:
        wait_for(lambda: app.connection_guard.open == 2, "both admitted")
        with connect(port, "127.0.0.2") as s:
            raw = read_all(s)
        assert status(raw) == 503 and app.rejected("too_many_client_connections") == 1
        with connect(port, "127.0.0.1") as s:   # another address is not affected
            s.sendall(get(headers=b"Connection: close\r\n"))
            assert status(read_all(s)) == 200
    finally:
        for s in held:
            s.close()


def test_log_lines_name_the_limit_and_never_a_header_value(
        serve: Callable[..., tuple[GuardedApp, int]]) -> None:
    app, port = serve(header_timeout=1.5)
    for req in (get(headers=headers(30, CANARY.encode())),
                get("/" + CANARY * 100, b"X-Secret: " + CANARY.encode() + b"\r\n"),
                b"POST /x HTTP/1.1\r\nAuthorization: Bearer " + CANARY.encode() + b"\r\n"):
        with connect(port) as s:
            s.sendall(req)
            read_all(s)
    lines = app.lines()
    assert [ln["limit"] for ln in lines] == ["limits.max_header_count",
                                             "limits.max_request_line", "limits.header_timeout"]
    assert CANARY not in app.log.getvalue()


def test_body_deadline_earns_time_with_bytes() -> None:
    lim = LimitsSettings(body_timeout=60.0, body_min_rate=8192)
    assert body_deadline(100.0, 0, lim) == 160.0
    assert body_deadline(100.0, 8192 * 10, lim) == 170.0
    # a body arriving at exactly the minimum rate is never behind its deadline
    assert all(body_deadline(0.0, 8192 * t, lim) > t for t in range(0, 10_000, 97))


def test_the_guard_is_found_through_uvicorn_middlewares() -> None:
    """uvicorn wraps the app (here in ProxyHeadersMiddleware); the protocol unwraps `.app`."""
    async def bare(scope: Any, receive: Any, send: Any) -> None:
        pass

    loop = asyncio.new_event_loop()
    try:
        guarded = GuardedApp(LimitsSettings())
        config = uvicorn.Config(guarded, proxy_headers=True)
        config.load()
        assert config.loaded_app is not guarded
        proto = LimitedHttpToolsProtocol(config, ServerState(), {}, _loop=loop)
        assert proto.guard is guarded.connection_guard
        config = uvicorn.Config(bare, proxy_headers=True)
        config.load()
        with pytest.raises(TypeError, match="connection_guard"):
            LimitedHttpToolsProtocol(config, ServerState(), {}, _loop=loop)
    finally:
        loop.close()


@pytest.mark.parametrize(("soft", "hard", "set_to", "warns"), [
    (1024, 1_000_000, 4096 + 1024 + 256, False),   # raised to what the caps need
    (1024, 2048, 2048, True),                       # only up to the hard limit, with a warning
    (100_000, 1_000_000, None, False),              # already enough: left alone
])
def test_ensure_descriptors(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int,
                            set_to: int | None, warns: bool) -> None:
    from router import limits
    from router.settings import Settings

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _: (soft, hard))
    monkeypatch.setattr(limits.resource, "setrlimit", lambda _, v: calls.append(v))
    warning = limits.ensure_descriptors(Settings())
    assert calls == ([] if set_to is None else [(set_to, hard)])
    assert (warning is not None) is warns
    if warns:
        assert "max_connections" in str(warning)


class HookApp(GuardedApp):
    """Reads the body, then (path /hook) puts a callback in the disconnect slot or (path
    /late) leaves it empty, and waits for the client to go; records what it saw."""

    def __init__(self, limits: LimitsSettings) -> None:
        super().__init__(limits)
        self.seen: list[object] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        await read_body(receive, scope["headers"], 1024)
        self.seen.append(scope.get(DISCONNECT_HOOK, "missing"))
        gone = asyncio.Event()
        if scope["path"] == "/hook":
            scope[DISCONNECT_HOOK] = gone.set
            await asyncio.wait_for(gone.wait(), 10)
            self.seen.append("called")
        else:
            for _ in range(1000):
                if scope[DISCONNECT_HOOK] == DISCONNECTED:
                    break
                await asyncio.sleep(0.01)
            self.seen.append(scope[DISCONNECT_HOOK])


@pytest.mark.parametrize("path", ["/hook", "/late"])
def test_a_lost_connection_reaches_the_scopes_disconnect_slot(path: str) -> None:
    """`connection_lost` calls the callback in the slot, or marks the slot DISCONNECTED when
    the app has not put one there yet (router.proxy then cancels at once)."""
    app = HookApp(LimitsSettings(**BASE))
    srv = ThreadedServer(app, http=LimitedHttpToolsProtocol).start()
    try:
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi".encode())
        deadline = time.monotonic() + 5
        while not app.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        s.close()
        while len(app.seen) < 2 and time.monotonic() < deadline + 5:
            time.sleep(0.01)
        assert app.seen == [None, "called" if path == "/hook" else DISCONNECTED]
    finally:
        srv.stop()
