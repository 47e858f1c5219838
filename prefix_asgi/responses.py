"""A complete (non-streaming) response as the two ASGI messages it takes."""

from __future__ import annotations

import json
from typing import Any

from prefix_asgi.types import Send

__all__ = ["JSON_HEADERS", "dumps", "send_bytes", "send_json"]

JSON_HEADERS = ((b"content-type", b"application/json"),)


def dumps(obj: Any) -> bytes:
    """Compact JSON, UTF-8 (not ASCII-escaped)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


async def send_bytes(send: Send, status: int, body: bytes,
                     headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]) -> None:
    """``http.response.start`` with ``headers`` plus ``content-length``, then the whole body."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """``obj`` as an ``application/json`` response; ``headers`` are added after the content type."""
    await send_bytes(send, status, dumps(obj), [*JSON_HEADERS, *(headers or ())])
