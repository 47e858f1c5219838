"""router.upstream against scripted loopback servers, on asyncio's loop and on uvloop's (the
router's): framing, keep-alive reuse, the failures and the exception types they raise."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
import pytest
import uvloop

from loadtest._net import quiet_port
from router.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout, translate_upstream
from router.upstream import HIGH_WATER, Origin, Response, UpstreamPool, origin_of

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

LOOPS = ["asyncio", "uvloop"]


def run(loop_kind: str, coro: Coroutine[Any, Any, Any]) -> Any:
    if loop_kind == "uvloop":
        return uvloop.run(coro)
    return asyncio.run(coro)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (Content-Length framing)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return head, body


class Server:
    """A loopback server answering each request with ``handler``; counts connections and
    keeps the request heads it read."""

    def __init__(self, handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter],
                                         Awaitable[None]]) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            with contextlib.suppress(Exception):
                await self.handler(self, reader, writer)
            with contextlib.suppress(Exception):
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def origin(self) -> Origin:
        return origin_of("http", "127.0.0.1", self.port)

    async def take(self, reader: asyncio.StreamReader) -> None:
        head, body = await read_request(reader)
        self.heads.append(head)
        self.bodies.append(body)


def keep_alive(answer: bytes, requests: int = 100) -> Any:
    async def handler(srv: Server, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        for _ in range(requests):
            await srv.take(reader)
            writer.write(answer)
            await writer.drain()
    return handler


async def body_of(resp: Response) -> bytes:
    data = await resp.read(5.0)
    resp.release()
    return data


async def request(pool: UpstreamPool, srv: Server, method: str = "POST",
                  body: bytes | None = b'{"a": 1}', read_timeout: float = 5.0,
                  headers: list[tuple[bytes, bytes]] | None = None) -> Response:
    return await pool.request(srv.origin, method, b"/v1/chat/completions?x=1",
                              headers or [(b"content-type", b"application/json")], body,
                              connect_timeout=5.0, read_timeout=read_timeout)


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_content_length_responses_reuse_one_connection(loop_kind: str) -> None:
    async def main() -> None:
        answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        async with Server(keep_alive(answer)) as srv:
            pool = UpstreamPool()
            for _ in range(3):
                resp = await request(pool, srv)
                assert resp.status == 200 and resp.content_type == "application/json"
                assert (b"content-length", b"2") in resp.headers
                assert await body_of(resp) == b"{}"
            await pool.close()
        assert srv.connections == 1
        head = srv.heads[0]
        # the request line keeps the raw target; Host and the body's length are ours
        assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
        assert b"content-type: application/json\r\n" in head and b"content-length: 8\r\n" in head
        assert srv.bodies == [b'{"a": 1}'] * 3

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_chunked_body_arrives_as_it_is_sent(loop_kind: str) -> None:
    async def main() -> None:
        step = asyncio.Event()

        async def handler(srv: Server, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                         b"transfer-encoding: chunked\r\n\r\n6\r\ndata 1\r\n")
            await writer.drain()
            await step.wait()
            writer.write(b"6\r\ndata 2\r\n0\r\n\r\n")
            await writer.drain()
            await reader.read()  # keep-alive: the client closes

        async with Server(handler) as srv:
            pool = UpstreamPool()
            resp = await request(pool, srv)
            assert resp.content_type == "text/event-stream"
            assert await resp.read_chunk(5.0) == b"data 1"  # before the rest was sent
            assert not resp.is_eof()
            step.set()
            assert await resp.read_chunk(5.0) == b"data 2"
            assert await resp.read_chunk(5.0) == b""
            assert resp.is_eof() and resp.keep_alive
            resp.release()
            await pool.close()

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_read_until_close_and_connection_close_are_not_pooled(loop_kind: str) -> None:
    async def main() -> None:
        answers = [b"HTTP/1.1 200 OK\r\n\r\nuntil close",
                   b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"]

        async def handler(srv: Server, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(answers[srv.connections - 1])
            await writer.drain()
            writer.close()

        async with Server(handler) as srv:
            pool = UpstreamPool()
            assert await body_of(await request(pool, srv)) == b"until close"
            assert await body_of(await request(pool, srv)) == b"ok"
            await pool.close()
        assert srv.connections == 2

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_informational_head_is_skipped_and_head_request_has_no_body(loop_kind: str) -> None:
    async def main() -> None:
        async def handler(srv: Server, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
                         b"HTTP/1.1 201 Created\r\ncontent-length: 1\r\n\r\nx")
            await srv.take(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")  # HEAD: no body
            await writer.drain()
            await reader.read()

        async with Server(handler) as srv:
            pool = UpstreamPool()
            resp = await request(pool, srv)
            assert resp.status == 201 and resp.headers == [(b"content-length", b"1")]
            assert await body_of(resp) == b"x"
            resp = await request(pool, srv, method="HEAD", body=None)
            assert resp.status == 200 and await resp.read_chunk(5.0) == b"" and resp.is_eof()
            resp.release()  # not pooled: closed
            await pool.close()
        assert srv.heads[1].startswith(b"HEAD ") and b"content-length" not in srv.heads[1]

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_bodyless_post_says_content_length_zero(loop_kind: str) -> None:
    async def main() -> None:
        answer = b"HTTP/1.1 204 No Content\r\n\r\n"
        async with Server(keep_alive(answer)) as srv:
            pool = UpstreamPool()
            assert await body_of(await request(pool, srv, body=None)) == b""
            assert await body_of(await request(pool, srv, method="GET", body=None)) == b""
            await pool.close()
        assert b"content-length: 0\r\n" in srv.heads[0]
        assert b"content-length" not in srv.heads[1]
        assert srv.connections == 1

    run(loop_kind, main())


def translated(exc: BaseException) -> type[UpstreamError]:
    try:
        with translate_upstream("r0", "test"):
            raise exc
    except UpstreamError as err:
        return type(err)
    raise AssertionError("not translated")


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize(("answer", "where", "raised", "translation"), [
    # closed before any response byte
    (b"", "head", aiohttp.ServerDisconnectedError, UpstreamConnectError),
    # closed part way through the head
    (b"HTTP/1.1 200 OK\r\ncontent-le", "head", aiohttp.ServerDisconnectedError,
     UpstreamConnectError),
    # closed before the declared length arrived
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", "body", aiohttp.ClientPayloadError,
     UpstreamError),
    # closed inside a chunked body
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n", "body",
     aiohttp.ClientPayloadError, UpstreamError),
    # not HTTP at all
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "head", aiohttp.ClientPayloadError, UpstreamError),
])
def test_broken_responses(loop_kind: str, answer: bytes, where: str,
                          raised: type[Exception], translation: type[UpstreamError]) -> None:
    async def main() -> None:
        async def handler(srv: Server, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(answer)
            await writer.drain()
            writer.close()

        async with Server(handler) as srv:
            pool = UpstreamPool()
            with pytest.raises(raised) as info:
                resp = await request(pool, srv)
                assert where == "body"
                await resp.read(5.0)
            assert translated(info.value) is translation
            await pool.close()

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_read_timeouts_and_refused_connect(loop_kind: str) -> None:
    async def main() -> None:
        async def silent(srv: Server, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            await reader.read()  # never answers

        async with Server(silent) as srv:
            pool = UpstreamPool()
            with pytest.raises(aiohttp.SocketTimeoutError) as info:
                await request(pool, srv, read_timeout=0.05)
            assert translated(info.value) is UpstreamTimeout
            await pool.close()
        pool = UpstreamPool()
        with pytest.raises(aiohttp.ClientConnectionError) as conn_info:
            await pool.request(origin_of("http", "127.0.0.1", quiet_port()), "GET", b"/", [],
                               None, connect_timeout=5.0, read_timeout=5.0)
        assert translated(conn_info.value) is UpstreamConnectError
        await pool.close()

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_set_exception_fails_the_waiting_read(loop_kind: str) -> None:
    async def main() -> None:
        async def stalls(srv: Server, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
            await reader.read()

        async with Server(stalls) as srv:
            pool = UpstreamPool()
            resp = await request(pool, srv)
            assert await resp.read_chunk(5.0) == b"a"
            pending = asyncio.ensure_future(resp.read_chunk())
            await asyncio.sleep(0)
            resp.set_exception(TimeoutError("idle"))
            with pytest.raises(TimeoutError):
                await pending
            with pytest.raises(TimeoutError):  # and every later read
                await resp.read_chunk()
            assert not resp.is_eof()
            resp.close()
            await pool.close()

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_expired_idle_connection_is_not_reused(loop_kind: str) -> None:
    async def main() -> None:
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        async with Server(keep_alive(answer)) as srv:
            pool = UpstreamPool(keepalive=0.0)  # every idle connection is already too old
            for _ in range(3):
                await body_of(await request(pool, srv))
            await pool.close()
        assert srv.connections == 3

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_reading_pauses_above_the_high_water_mark(loop_kind: str) -> None:
    async def main() -> None:
        size = 4 * HIGH_WATER
        payload = bytes(range(256)) * (size // 256)

        async def big(srv: Server, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + payload)
            await writer.drain()
            await reader.read()

        async with Server(big) as srv:
            pool = UpstreamPool()
            resp = await request(pool, srv)
            paused = False
            for _ in range(200):  # bounded: let the whole body arrive if nothing pauses it
                await asyncio.sleep(0.005)
                if resp._conn.paused:
                    paused = True
                    break
            assert paused and resp._size <= size
            assert await body_of(resp) == payload
            await pool.close()

    run(loop_kind, main())


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize(("first", "second"), [(0.05, 0.4), (5.0, 0.1)])
def test_one_timer_per_connection_keeps_each_waits_own_deadline(loop_kind: str, first: float,
                                                                second: float) -> None:
    """Exchange 1 on a connection arms its timer for ``first``; exchange 2 on the same
    connection (stalled) must fail after its own ``second``: re-armed when the old timer
    fires early (0.05 then 0.4), a new timer when the old one would fire late (5.0 then 0.1)."""
    async def main() -> None:
        async def answers_once(srv: Server, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
            await srv.take(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            await srv.take(reader)
            await reader.read()  # never answers the second

        async with Server(answers_once) as srv:
            pool = UpstreamPool()
            assert await body_of(await request(pool, srv, read_timeout=first)) == b"ok"
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(aiohttp.SocketTimeoutError):
                await request(pool, srv, read_timeout=second)
            assert srv.connections == 1
            assert loop.time() - t0 >= second * 0.9  # never at exchange 1's earlier deadline
            await pool.close()

    run(loop_kind, main())
