"""Stepping a coroutine by hand, exactly as ``asyncio.Task.__step`` does, in one place.

Two hot paths run a coroutine without giving it a Task of its own: the router's
``DisconnectWatch`` (it awaits the ASGI ``receive()`` of every proxied request) and the replica's
HTTP server (it runs each exchange's first step inside the socket read). A Task per request costs
its creation, a scheduled first step, and on cancellation one more loop pass to unwind
(``scripts/bench_stepping.py`` measures both ways side by side; the figures are in
docs/architecture.md). Stepping by hand means speaking asyncio's private await protocol:

- ``Future.__await__`` marks the future with ``_asyncio_future_blocking = True`` and yields it;
  whoever steps the coroutine must clear the flag (a Task does) before waiting on the future,
  or awaiting it again is refused;
- a bare ``yield`` (``asyncio.sleep(0)``) yields ``None``: step again on the next loop pass;
- anything else is a programming error that a Task answers by throwing ``RuntimeError`` into
  the coroutine - so does `advance`.

The flag is the only private name used, and only here; ``tests/prefix_asgi/test_stepping.py``
checks `advance` against a real Task on every branch, so an asyncio change shows up there.

Cost: one ``send``/``throw`` per step, no allocation beyond what the coroutine does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["advance"]

Steppable = Coroutine[Any, Any, Any] | Generator[Any, None, Any]


def advance(coro: Steppable, exc: BaseException | None = None) -> asyncio.Future[Any] | None:
    """Run ``coro`` to its next suspension point (``throw(exc)`` instead of ``send(None)`` when
    ``exc`` is given) and return what it waits on: an asyncio future, already taken over as a
    Task takes it (wait for it to be done, then call `advance` again, whatever its outcome: the
    coroutine reads the result or exception itself), or ``None`` for a bare yield.

    Raises ``StopIteration`` (its ``value`` is the coroutine's return value) when the coroutine
    finished, and whatever exception the coroutine let out."""
    while True:
        waiting = coro.send(None) if exc is None else coro.throw(exc)
        if waiting is None:
            return None
        blocking = getattr(waiting, "_asyncio_future_blocking", None)
        if blocking:
            waiting._asyncio_future_blocking = False
            return waiting  # type: ignore[no-any-return]
        if blocking is not None:
            exc = RuntimeError(f"yield was used instead of yield from with {waiting!r}")
        else:
            exc = RuntimeError(f"bad yield: {waiting!r}")
