#!/usr/bin/env python3
"""CPU per request of the router's HTTP protocol with and without its connection limits.

    python scripts/bench_limits.py [--requests 20000] [--rounds 5]

Feeds the same keep-alive request (a 1.5 KB chat POST, 12 headers, head and body in one read)
to uvicorn's `HttpToolsProtocol` and to `router.limits.LimitedHttpToolsProtocol`, each over one
in-memory transport on a uvloop loop, in front of the same minimal ASGI app (read the body,
answer 200). Rounds alternate the two classes; the figure is process CPU time per request, the
median over rounds, and the difference is what the limits add to every request. Run it under
`flock /work/.bench.lock`; compare the columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from router.accesslog import AccessLog
from router.limits import ConnectionGuard, LimitedHttpToolsProtocol
from router.metrics import RouterMetrics
from router.settings import LimitsSettings

BODY = json.dumps({"model": "m", "messages": [
    {"role": "system", "content": "You are terse. " * 100},
    {"role": "user", "content": "hello"}]}).encode()
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nUser-Agent: OpenAI/Python\r\n"
           b"Accept: application/json\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive"
           b"\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-x\r\nX-Stainless-Lang:"
           b" python\r\nX-Stainless-Arch: x64\r\nX-Stainless-Os: Linux\r\nX-Stainless-Runtime: "
           b"CPython\r\nContent-Length: %d\r\n\r\n" % len(BODY)) + BODY


class App:
    def __init__(self) -> None:
        self.connection_guard = ConnectionGuard(LimitsSettings(), RouterMetrics(),
                                                AccessLog())
        self.answered = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})
        self.answered.set()


class Transport(asyncio.Transport):
    """Accepts writes and counts them; enough of a socket transport for uvicorn."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def run(cls: type[HttpToolsProtocol], n: int) -> float:
    app = App()
    config = uvicorn.Config(app, proxy_headers=False, lifespan="off", access_log=False)
    config.load()
    proto = cls(config, ServerState(), {})
    proto.connection_made(Transport())
    t0 = time.process_time()
    for _ in range(n):
        proto.data_received(REQUEST)
        await app.answered.wait()
        app.answered.clear()
    cpu = time.process_time() - t0
    proto.connection_lost(None)
    return cpu / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    classes = {"uvicorn httptools": HttpToolsProtocol,
               "with router.limits": LimitedHttpToolsProtocol}
    per: dict[str, list[float]] = {name: [] for name in classes}
    for _ in range(args.rounds):
        for name, cls in classes.items():
            per[name].append(loop.run_until_complete(run(cls, args.requests)))
    loop.close()
    base, limited = (statistics.median(per[name]) * 1e6 for name in classes)
    print(f"{args.requests} requests x {args.rounds} rounds, median CPU per request:")
    print(f"  uvicorn httptools:   {base:.2f} us")
    print(f"  with router.limits:  {limited:.2f} us  (+{limited - base:.2f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
