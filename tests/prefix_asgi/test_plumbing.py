"""Body reading, complete responses and the lifespan loop, on scripted ASGI message streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from prefix_asgi import (
    BodyTooLarge,
    ClientGone,
    Message,
    read_body,
    send_bytes,
    send_json,
    serve_lifespan,
)


def scripted(*messages: dict[str, Any]) -> Callable[[], Awaitable[Message]]:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0)

    return receive


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


@pytest.mark.parametrize(("messages", "limit", "outcome"), [
    ([body(b"one message")], 100, b"one message"),
    ([body(b"ab", True), body(b"", True), body(b"cd")], 100, b"abcd"),   # chunks joined
    ([body(b"")], 0, b""),                                              # empty body, zero limit
    ([body(b"x" * 10)], 10, b"x" * 10),                                 # exactly the limit
    ([body(b"x" * 6, True), body(b"x" * 5)], 10, BodyTooLarge),         # over it, across chunks
    ([body(b"ab", True), {"type": "http.disconnect"}], 100, ClientGone),
])  # fmt: skip
def test_read_body(messages: list[dict[str, Any]], limit: int, outcome: Any) -> None:
    receive = scripted(*messages)
    if isinstance(outcome, bytes):
        assert asyncio.run(read_body(receive, limit)) == outcome
    else:
        with pytest.raises(outcome):
            asyncio.run(read_body(receive, limit))


def test_send_json_is_one_complete_response_with_its_length() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(send_json(send, 418, {"név": [1, 2]}, [(b"x-a", b"1")]))
    start, end = sent
    payload = json.dumps({"név": [1, 2]}, separators=(",", ":"), ensure_ascii=False).encode()
    assert start == {"type": "http.response.start", "status": 418, "headers": [
        (b"content-type", b"application/json"), (b"x-a", b"1"),
        (b"content-length", str(len(payload)).encode())]}
    assert end == {"type": "http.response.body", "body": payload}
    sent.clear()
    asyncio.run(send_bytes(send, 204, b"", [(b"content-type", b"text/plain")]))
    assert sent[0]["headers"][-1] == (b"content-length", b"0")


def test_lifespan_runs_startup_then_shutdown() -> None:
    calls: list[str] = []
    sent: list[str] = []

    async def startup() -> None:
        calls.append("startup")

    async def shutdown() -> None:
        calls.append("shutdown")

    async def send(message: Message) -> None:
        sent.append(message["type"])

    asyncio.run(serve_lifespan(scripted({"type": "lifespan.startup"},
                                        {"type": "lifespan.shutdown"}), send, startup, shutdown))
    assert calls == ["startup", "shutdown"]
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_a_failed_startup_is_reported_and_ends_the_lifespan() -> None:
    sent: list[Message] = []

    async def startup() -> None:
        raise OSError("port in use")

    async def never() -> None:
        raise AssertionError("shutdown after a failed startup")

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(serve_lifespan(scripted({"type": "lifespan.startup"}), send, startup, never))
    assert sent == [{"type": "lifespan.startup.failed", "message": "port in use"}]
