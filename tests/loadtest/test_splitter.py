"""The round-robin TCP splitter: connections alternate, bytes flow as they arrive, both ways."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from loadtest._net import quiet_port
from loadtest.splitter import serve

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    """Run a coroutine on the stock event loop, or on uvloop (what the splitter process uses)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run  # type: ignore[no-any-return]
    return asyncio.run


async def _with_splitter(handlers: list[Handler],
                         body: Callable[[int], Awaitable[None]]) -> None:
    servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in handlers]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    port = quiet_port()
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(port, [("127.0.0.1", p) for p in ports], ready=ready,
                                     stop=stop))
    await asyncio.wait_for(ready.wait(), 5)
    try:
        await asyncio.wait_for(body(port), 10)
    finally:
        stop.set()
        await task
        for s in servers:
            s.close()


def _named(name: bytes) -> Handler:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(name + b"\n")
        await w.drain()
        w.close()
    return handler


def test_connections_alternate_between_the_upstreams(loop_run: Any) -> None:
    seen: list[bytes] = []

    async def body(port: int) -> None:
        for _ in range(5):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            seen.append((await r.readline()).strip())
            w.close()

    loop_run(_with_splitter([_named(b"a"), _named(b"b"), _named(b"c")], body))
    assert seen == [b"a", b"b", b"c", b"a", b"b"]


def test_bytes_are_relayed_as_they_arrive_in_both_directions(loop_run: Any) -> None:
    # each side sends its next piece only after the other side received the previous one:
    # a splitter that held bytes back (waiting for more, or for the end) would deadlock here
    got_first = asyncio.Event()
    log: list[bytes] = []

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        log.append(await r.readexactly(5))              # the request head, before its rest
        w.write(b"data: 1\n\n")                          # first SSE event
        await w.drain()
        await got_first.wait()
        log.append(await r.readexactly(4))
        w.write(b"data: 2\n\n")
        await w.drain()
        log.append(await r.read())                       # the client's half-close arrives
        w.write(b"bye")
        await w.drain()
        w.close()

    async def body(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"HEAD ")
        await w.drain()
        assert await r.readexactly(9) == b"data: 1\n\n"
        w.write(b"rest")
        await w.drain()
        got_first.set()
        assert await r.readexactly(9) == b"data: 2\n\n"
        w.write_eof()                                    # half-close: the reply still comes
        assert await r.read() == b"bye"
        w.close()

    loop_run(_with_splitter([upstream], body))
    assert log == [b"HEAD ", b"rest", b""]


def test_a_large_body_arrives_whole(loop_run: Any) -> None:
    blob = bytes(range(256)) * 20_000  # 5 MB: exercises the flow control

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1 << 16):
            w.write(data)
            await w.drain()
        w.close()

    async def body(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)

        async def send() -> None:
            w.write(blob)
            await w.drain()
            w.write_eof()

        sender = asyncio.create_task(send())
        assert await r.read() == blob
        await sender
        w.close()

    loop_run(_with_splitter([echo], body))


def test_an_upstream_that_refuses_closes_the_client(loop_run: Any) -> None:
    async def body(port: int) -> None:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        assert await r.read() == b""
        w.close()

    async def run() -> None:
        dead = quiet_port()  # nothing listens there
        ready, stop = asyncio.Event(), asyncio.Event()
        port = quiet_port()
        task = asyncio.create_task(serve(port, [("127.0.0.1", dead)], ready=ready, stop=stop))
        await ready.wait()
        await asyncio.wait_for(body(port), 10)
        stop.set()
        await task

    loop_run(run())
