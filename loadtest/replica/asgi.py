"""The replica's ASGI helpers on top of `prefix_asgi`: JSON bodies, disconnects, abrupt closes.

The replica is a raw ASGI app rather than a framework app because it must (a) stay cheap per
request (the ``--instant`` replica has to outrun the router several times over), (b) notice a
client that goes away while a request waits in the engine (`race_disconnect`), and (c) be able
to cut a connection without a terminating chunk (`AbruptClose`: raised after the response has
started, the server then drops the connection; `httpd` does not log it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from prefix_asgi import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    dumps,
    read_body,
    send_bytes,
    send_json,
)
from templates_audit import jsonfast

__all__ = [
    "LOOPBACK", "MAX_BODY", "AbruptClose", "BodyTooLarge", "ClientGone", "Receive", "Scope",
    "Send", "dumps", "local_port", "parse_json", "peer_host", "race_disconnect", "read_body",
    "send_bytes", "send_json", "wait_disconnect",
]

T = TypeVar("T")

LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
MAX_BODY = 64 * 1024 * 1024


class AbruptClose(Exception):
    """Raised by a handler to drop the connection without finishing the response."""


def parse_json(body: bytes) -> Any:
    """A JSON request body (empty: ``{}``); invalid JSON raises ValueError. Decoded by orjson
    when installed and certainly equal to json.loads (`templates_audit.jsonfast`)."""
    return jsonfast.loads(body) if body else {}


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
