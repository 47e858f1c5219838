"""Reading an HTTP request body from ASGI ``http.request`` messages under a size limit.

Cost: one ``receive()`` per message; a body that arrives in one message (the usual case) is
returned as is, without a copy. Callers translate `BodyTooLarge` into their own error (the
router's 413 in OpenAI format, the replica's vLLM-shaped one).
"""

from __future__ import annotations

from prefix_asgi.types import Receive

__all__ = ["BodyTooLarge", "ClientGone", "read_body"]


class ClientGone(Exception):
    """The client disconnected before the exchange was complete."""


class BodyTooLarge(Exception):
    """The body grew past the reader's limit (raised as soon as it does, not at the end)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds the limit of {limit} bytes")
        self.limit = limit


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; `ClientGone` on ``http.disconnect``, `BodyTooLarge` once more
    than ``limit`` bytes arrived."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        if not msg.get("more_body", False):
            return b"".join([*chunks, chunk]) if chunks else chunk
        chunks.append(chunk)
