"""Run one replica as a process: `prefix-loadtest replica ...` / `python -m loadtest replica ...`.

The replica binds its sockets itself and hands them to uvicorn, so it can stop listening on the
public port and start again (the refuse-connections fault) without touching connections already
accepted: refusing closes the asyncio server of that socket (new connects get ECONNREFUSED);
resuming binds a fresh socket on the same port and serves it with the same protocol factory
uvicorn uses. The optional admin socket is bound to 127.0.0.1 and never closed. SIGINT/SIGTERM
shut down gracefully (uvicorn), cancelling requests still open after 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
from typing import Any

import prometheus_client
import uvicorn

from .asgi import install_log_filter
from .config import ReplicaConfig, from_namespace
from .config import add_arguments as add_arguments  # the `replica` subcommand's flags
from .server import Replica

GRACE_SECONDS = 2


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


class UvicornListener:
    """Stops and restarts listening on the first socket of a running uvicorn server."""

    def __init__(self, server: uvicorn.Server, host: str, port: int) -> None:
        self._server = server
        self._host = host
        self._port = port
        self._open = True
        self._reopening: asyncio.Task[None] | None = None

    @property
    def listening(self) -> bool:
        return self._open

    def refuse(self) -> None:
        if not self._open:
            return
        self._server.servers[0].close()
        self._open = False

    def resume(self) -> None:
        if self._open:
            return
        server, config = self._server, self._server.config
        loop = asyncio.get_running_loop()

        def protocol() -> Any:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=server.server_state,
                app_state=server.lifespan.state)

        async def reopen() -> None:
            try:
                sock = bind_socket(self._host, self._port)
                server.servers[0] = await loop.create_server(protocol, sock=sock,
                                                             backlog=config.backlog)
            except OSError as exc:
                self._open = False
                logging.getLogger("uvicorn.error").error("cannot listen again on %s:%s: %s",
                                                         self._host, self._port, exc)

        self._open = True
        self._reopening = loop.create_task(reopen())


class CoalescingTransport:
    """A transport whose writes in one event-loop iteration leave in one send.

    uvicorn writes a response's head and its body separately, and uvloop sends each write at
    once: two syscalls (and two TCP segments) for every response. Buffering until the end of the
    loop iteration joins them (and the events of an instant stream) without delaying anything.
    Everything else is the wrapped transport's; ``close`` sends what is buffered first, as the
    writes had already left before.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._buffer:
            self._loop.call_soon(self.flush)
        self._buffer.append(data)

    def flush(self) -> None:
        buf = self._buffer
        if buf:
            data = buf[0] if len(buf) == 1 else b"".join(buf)
            buf.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._buffer.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._buffer))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _http_protocol() -> Any:
    """uvicorn's httptools protocol writing through a `CoalescingTransport` ("auto" without it)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
        return "auto"

    class Protocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(
                CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    return Protocol


def serve(config: ReplicaConfig) -> None:
    prometheus_client.disable_created_metrics()
    install_log_filter()
    sockets = [bind_socket(config.host, config.port)]
    if config.admin_port is not None:
        sockets.append(bind_socket("127.0.0.1", config.admin_port))
    replica = Replica(config)
    # No proxy-headers middleware: nothing sits in front of a replica that should rewrite the
    # peer address (the admin endpoints trust the real one), and it costs every request.
    uv_config = uvicorn.Config(replica, log_level=config.log_level, access_log=False,
                               lifespan="on", timeout_graceful_shutdown=GRACE_SECONDS,
                               proxy_headers=False, http=_http_protocol())
    server = uvicorn.Server(uv_config)
    replica.listener = UvicornListener(server, config.host, config.port)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)


def main(args: argparse.Namespace) -> int:
    serve(from_namespace(args))
    return 0
