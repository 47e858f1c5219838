"""Minimal ASGI plumbing for the replica: bodies, responses, disconnects, abrupt closes.

The replica is a raw ASGI app rather than a framework app because it must (a) stay cheap per
request (the ``--instant`` replica has to outrun the router several times over), (b) notice a
client that goes away while a request waits in the engine (`race_disconnect`), and (c) be able
to cut a connection without a terminating chunk (`AbruptClose`: raised after the response has
started, the server then drops the connection; `httpd` does not log it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from templates_audit import jsonfast

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

T = TypeVar("T")

LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
MAX_BODY = 64 * 1024 * 1024


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


class AbruptClose(Exception):
    """Raised by a handler to drop the connection without finishing the response."""


class BodyTooLarge(Exception):
    pass


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone
        body = msg.get("body", b"")
        size += len(body)
        if size > MAX_BODY:
            raise BodyTooLarge
        chunks.append(body)
        if not msg.get("more_body", False):
            return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    """A JSON request body (empty: ``{}``); invalid JSON raises ValueError. Decoded by orjson
    when installed and certainly equal to json.loads (`templates_audit.jsonfast`)."""
    return jsonfast.loads(body) if body else {}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


async def send_bytes(send: Send, status: int, body: bytes, content_type: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    hdrs = [(b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode())]
    if headers:
        hdrs += headers
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send_bytes(send, status, dumps(obj), "application/json", headers)


async def wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def race_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await `work`, or raise ClientGone (cancelling it) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watch):
            if not t.done():
                t.cancel()
        # Let the cancelled tasks run their cleanup before we act on the outcome.
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientGone


def peer_host(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def local_port(scope: Scope) -> int | None:
    server = scope.get("server")
    return int(server[1]) if server and server[1] is not None else None
