#!/usr/bin/env python3
"""Hand-stepped coroutines (`prefix_asgi.advance`) against plain asyncio Tasks, side by side.

    flock /work/.bench.lock .venv/bin/python scripts/bench_stepping.py [--requests 20000] [--rounds 5]

Two places run a coroutine per request without giving it a Task; each is measured against the
plain-Task version of itself, interleaved in rounds in one process on uvloop (as the servers
run), as event-loop CPU per request (``time.process_time``):

* router ``DisconnectWatch``: while a request is proxied, ``receive()`` is awaited in the
  background in case the client disconnects. Per request: start the watch, let the request run
  one loop pass, stop the watch (the client did not leave - the usual case). Task version:
  ``create_task`` a coroutine awaiting ``receive()``, then ``cancel()`` it and let it unwind.
  ``receive()`` waits on an ``asyncio.Event``, as uvicorn's does.
* replica httpd: an exchange's first step runs inside the socket read; an instant reply is done
  before the read returns. Per request: run an ASGI-shaped coroutine that answers without
  waiting. Task version: ``create_task`` it and let the loop run it.

Prints one Markdown table (µs per request, and the Task's cost as a multiple of the
hand-stepped one); the figures go to docs/architecture.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from prefix_asgi import advance
from router.proxy import DisconnectWatch


def make_receive() -> Callable[[], Coroutine[Any, Any, dict[str, Any]]]:
    event = asyncio.Event()  # set only on a disconnect, which these requests never see

    async def receive() -> dict[str, Any]:
        await event.wait()
        return {"type": "http.disconnect"}

    return receive


def _gone() -> None:
    raise AssertionError("no client leaves in this benchmark")


async def watch_by_hand(n: int) -> None:
    for _ in range(n):
        watch = DisconnectWatch(make_receive(), _gone)
        await asyncio.sleep(0)  # the proxied request's own work: one loop pass
        watch.close()


async def watch_by_task(n: int) -> None:
    async def watch(receive: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> None:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            _gone()

    for _ in range(n):
        task = asyncio.get_running_loop().create_task(watch(make_receive()))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def instant_app(sent: list[int]) -> None:
    sent.append(1)  # an instant reply: both send() calls complete without waiting


async def first_step_by_hand(n: int) -> None:
    sent: list[int] = []
    for _ in range(n):
        coro = instant_app(sent)
        with contextlib.suppress(StopIteration):
            advance(coro)
    assert len(sent) == n


async def first_step_by_task(n: int) -> None:
    sent: list[int] = []
    loop = asyncio.get_running_loop()
    for _ in range(n):
        await loop.create_task(instant_app(sent))
    assert len(sent) == n


CASES: list[tuple[str, Callable[[int], Coroutine[Any, Any, None]],
                  Callable[[int], Coroutine[Any, Any, None]]]] = [
    ("router DisconnectWatch (start, one loop pass, stop)", watch_by_hand, watch_by_task),
    ("replica httpd first step (instant reply)", first_step_by_hand, first_step_by_task),
]


def cpu_us(run: Callable[[int], Coroutine[Any, Any, None]], n: int) -> float:
    t0 = time.process_time()
    uvloop.run(run(n))
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--requests", type=int, default=20000, help="per cell and round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"{args.requests} requests per cell, {args.rounds} rounds interleaved, uvloop; "
          "median of rounds\n")
    print("| path | hand-stepped (advance) µs/req | asyncio Task µs/req | Task / hand-stepped |")
    print("|---|---|---|---|")
    for name, by_hand, by_task in CASES:
        hand, task = [], []
        for _ in range(args.rounds):
            hand.append(cpu_us(by_hand, args.requests))
            task.append(cpu_us(by_task, args.requests))
        h, t = statistics.median(hand), statistics.median(task)
        print(f"| {name} | {h:.2f} | {t:.2f} | {t / h:.2f}x |")


if __name__ == "__main__":
    main()
