"""Shared test fixtures: free loopback ports and real uvicorn servers on 127.0.0.1.

Every in-process server a test starts binds 127.0.0.1 on a port the kernel hands out, so suites
can run side by side; a server started later (a subprocess, a listener bound on start-up) gets
`loadtest._net.quiet_port`: free, never handed out before, and below the kernel's ephemeral
range, so no outgoing connection of the suite can take it in between. Every server is stopped by
the fixture that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from loadtest._net import quiet_port


def wait_for_port(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def wait_for(check: Callable[[], bool], what: str, tries: int = 300) -> None:
    """Poll ``check`` every 20 ms, up to ``tries`` times; fail naming ``what`` otherwise."""
    for _ in range(tries):
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class ThreadedServer:
    """A real uvicorn server for an ASGI app, run on its own event loop in a thread.

    The listening socket is bound here, before uvicorn starts, and handed to it: the port is
    this server's from construction on. (A port picked free and bound later can be taken in
    between by another process on a machine running several suites, which then answered this
    server's clients, or refused them once it stopped.)"""

    def __init__(self, app: Any, port: int | None = None, **config: Any) -> None:
        # proto IPPROTO_TCP as getaddrinfo gives it: asyncio sets TCP_NODELAY on accepted
        # sockets only when it is (with proto 0, Nagle + delayed ACK cost 40 ms a request)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("127.0.0.1", port or 0))
        except OSError:
            self.sock.close()
            raise
        self.port = int(self.sock.getsockname()[1])
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                             lifespan="on", **config)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=15)
        self.sock.close()  # uvicorn closed it already, unless it never started

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def port() -> int:
    return quiet_port()


def require_binary(name: str) -> str:
    """Path of a binary the test needs; in CI a missing binary is a failure, not a skip."""
    path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is required in CI but is not installed (.ci/run must install it)")
    pytest.skip(f"{name} not installed")


@pytest.fixture
def threaded_server() -> Iterator[Any]:
    started: list[ThreadedServer] = []

    def start(app: Any, **config: Any) -> ThreadedServer:
        srv = ThreadedServer(app, **config).start()
        started.append(srv)
        return srv

    yield start
    for srv in reversed(started):
        srv.stop()


async def asgi_lifespan(receive: Any, send: Any) -> None:
    """Acknowledge every lifespan event until shutdown (for the tests' raw-ASGI apps)."""
    while True:
        msg = await receive()
        await send({"type": msg["type"] + ".complete"})
        if msg["type"] == "lifespan.shutdown":
            return
