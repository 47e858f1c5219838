"""The application side of the ASGI lifespan protocol, written once.

`serve_lifespan` answers ``lifespan.startup`` by awaiting ``startup()`` (an exception becomes
``lifespan.startup.failed`` with its message, and the loop ends: the server then refuses to
serve) and ``lifespan.shutdown`` by awaiting ``shutdown()``; it returns after shutdown. Apps start
and stop their background loops in those two callables, nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from prefix_asgi.types import Receive, Send

__all__ = ["serve_lifespan"]


async def serve_lifespan(receive: Receive, send: Send, startup: Callable[[], Awaitable[None]],
                         shutdown: Callable[[], Awaitable[None]],
                         log: logging.Logger | None = None) -> None:
    """Run one lifespan scope; ``log`` (if given) records a failed startup with its traceback."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            try:
                await startup()
            except Exception as exc:
                if log is not None:
                    log.exception("startup failed")
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
