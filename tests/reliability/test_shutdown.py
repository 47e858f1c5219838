"""Graceful shutdown: SIGTERM to a router process while streams are open.

Expectations (uvicorn's order, which the router's CLI relies on): the listening socket closes at
once (new connections are refused while old streams still run), open streams run to their
``[DONE]`` within ``shutdown.grace_period``, and the process exits with status 0. A stream that
outlives the grace period is cut - an SSE client gets a `data: {"error": ...}` event and a properly
ended stream - and the process still exits 0 shortly after the grace period.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import aiohttp
import pytest

from loadtest.fleet import Fleet
from tests.reliability.conftest import RouterProcess, promise, router_config
from tests.reliability.load import chat_body

pytestmark = pytest.mark.slow


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True


async def open_streams(url: str, n: int, max_tokens: int,
                       session: aiohttp.ClientSession) -> list[asyncio.Task[tuple[str, float]]]:
    """n streams, returned once each has delivered its first chunk; each task yields how the
    stream ended and when."""
    started = [asyncio.Event() for _ in range(n)]

    async def stream(i: int) -> tuple[str, float]:
        body = chat_body(i, stream=True, max_tokens=max_tokens)
        data = b""
        try:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                async for chunk in resp.content.iter_any():
                    data += chunk
                    started[i].set()
        except aiohttp.ClientError as exc:
            return f"cut ({type(exc).__name__})", time.monotonic()
        finally:
            started[i].set()
        if data.rstrip().endswith(b"data: [DONE]"):
            return "done", time.monotonic()
        if b'data: {"error"' in data:
            return "error event", time.monotonic()
        return "truncated", time.monotonic()

    tasks = [asyncio.create_task(stream(i)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
    return tasks


@pytest.mark.parametrize("grace", [10.0, 1.0], ids=["streams_fit", "streams_outlive_grace"])
def test_sigterm_under_load(start_fleet: Callable[..., Fleet],
                            start_router: Callable[..., RouterProcess],
                            measure: Callable[..., None], grace: float) -> None:
    fleet = start_fleet(2)   # speed 1: 10 ms steps, a 300-token stream lasts ~3 s
    router = start_router(router_config(fleet.urls, fleet.names,
                                        proxy={"idle_timeout": 30.0},
                                        shutdown={"grace_period": grace}))
    assert router.proc is not None

    async def scenario() -> dict[str, object]:
        async with aiohttp.ClientSession() as session:
            tasks = await open_streams(router.url, 8, 300, session)
            t_term = time.monotonic()
            router.proc.terminate()  # type: ignore[union-attr]
            refused_after: float | None = None
            # until refused, or no stream is left to prove it was refused *while* they ran
            while time.monotonic() - t_term < 30 and not all(t.done() for t in tasks):
                if await asyncio.to_thread(refused, router.port):
                    refused_after = time.monotonic() - t_term
                    break
                await asyncio.sleep(0.02)
            still_running = sum(not t.done() for t in tasks)
            ends = await asyncio.gather(*tasks)
        code = await asyncio.to_thread(router.proc.wait, grace + 15)  # type: ignore[union-attr]
        return dict(ends=ends, t_term=t_term, refused_after=refused_after,
                    still_running=still_running, code=code,
                    exited_after=time.monotonic() - t_term)

    r = asyncio.run(scenario())
    ends: list[tuple[str, float]] = r["ends"]  # type: ignore[assignment]
    t_term = float(r["t_term"])  # type: ignore[arg-type]
    last_end = max(t for _, t in ends) - t_term
    measure(f"shutdown_grace_{grace:g}s", streams=len(ends),
            outcomes=sorted({k for k, _ in ends}),
            refused_new_connections_after_s=round(float(r["refused_after"] or 0), 3),  # type: ignore[arg-type]
            streams_running_when_refused=r["still_running"],
            last_stream_end_after_sigterm_s=round(last_end, 2),
            exit_code=r["code"], exited_after_s=round(float(r["exited_after"]), 2))  # type: ignore[arg-type]
    assert r["code"] == 0
    assert r["refused_after"] is not None and r["still_running"]  # refused while streams ran
    if grace >= 10:
        assert {k for k, _ in ends} == {"done"}   # none was cut: all ended within the grace
    else:
        # cut at the grace period, not finished, each SSE stream ended with an error event
        assert {k for k, _ in ends} == {"error event"}
        promise(measure, f"shutdown_grace_{grace:g}s", "exit_after_sigterm",
                float(r["exited_after"]), grace + 5)  # type: ignore[arg-type]
