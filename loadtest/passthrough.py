"""The floor of the router's stack: a pass-through proxy with no routing at all.

uvicorn (httptools, uvloop) serving a raw ASGI app that forwards every request to one upstream
through a pooled aiohttp client and relays the status, the headers (hop-by-hop ones dropped) and
the body chunk by chunk - what the router does minus everything that makes it a router (body
validation, key, policy, affinity, retries, disconnect watch, health, metrics, logs). The
overhead benchmark runs it next to the router (setup ``passthrough``), so the share of the
router's cost that the stack itself sets is measured in the same run.

    python -m loadtest.passthrough --upstream http://127.0.0.1:8101 --port 8200
"""

from __future__ import annotations

import argparse

import aiohttp
import uvicorn

from prefix_asgi import Receive, Scope, Send, serve_lifespan

_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                  b"host", b"te", b"trailer", b"upgrade", b"proxy-connection"})


class PassThrough:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def _startup(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             auto_decompress=False)

    async def _shutdown(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send, self._startup, self._shutdown)
            return
        if scope["type"] != "http" or self.session is None:
            return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k not in _HOP]
        query = scope.get("query_string", b"")
        url = self.upstream + scope["path"] + ("?" + query.decode("latin-1") if query else "")
        async with self.session.request(scope["method"], url, data=b"".join(chunks),
                                        headers=headers, allow_redirects=False) as resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(k.lower(), v) for k, v in resp.raw_headers
                                    if k.lower() not in _HOP]})
            while True:
                chunk = await resp.content.readany()
                if not chunk:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--upstream", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(PassThrough(args.upstream), host=args.host, port=args.port, loop="uvloop",
                http="httptools", lifespan="on", log_level="warning", access_log=False,
                proxy_headers=False, server_header=False, date_header=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
