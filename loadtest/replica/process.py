"""Run one replica as a process: `prefix-loadtest replica ...` / `python -m loadtest replica ...`.

The replica is served by `httpd` (a lean HTTP/1.1 server: uvicorn's per-request cost was more than
the instant replica's own work). The replica binds its sockets itself, so it can stop listening
on the public port and start again (the refuse-connections fault) without touching connections
already accepted: refusing closes the asyncio server of that socket (new connects get
ECONNREFUSED); resuming binds a fresh socket on the same port. The optional admin socket is bound
to 127.0.0.1 and never closed. SIGINT/SIGTERM shut down gracefully, cancelling requests still
open after 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys

import prometheus_client

from . import httpd
from .asgi import AbruptClose, ClientGone
from .config import ReplicaConfig, from_namespace
from .config import add_arguments as add_arguments  # the `replica` subcommand's flags
from .server import Replica

log = logging.getLogger("loadtest.replica")
GRACE_SECONDS = 2


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


class Listener:
    """Stops and restarts listening on the public socket of a running `httpd.Server`."""

    def __init__(self, server: httpd.Server, host: str, port: int) -> None:
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
        self._server.refuse(0)
        self._open = False

    def resume(self) -> None:
        if self._open:
            return

        async def reopen() -> None:
            try:
                await self._server.resume(0, bind_socket(self._host, self._port))
            except OSError as exc:
                self._open = False
                log.error("cannot listen again on %s:%s: %s", self._host, self._port, exc)

        self._open = True
        self._reopening = asyncio.get_running_loop().create_task(reopen())


def serve(config: ReplicaConfig) -> None:
    prometheus_client.disable_created_metrics()
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sockets = [_listen_socket(config.host, config.port)]
    if config.admin_port is not None:
        sockets.append(_listen_socket("127.0.0.1", config.admin_port))
    replica = Replica(config)
    server = httpd.Server(replica, grace=GRACE_SECONDS, quiet=(AbruptClose, ClientGone))
    replica.listener = Listener(server, config.host, config.port)
    with contextlib.suppress(KeyboardInterrupt):
        httpd.run(server, sockets)


class CannotListen(Exception):
    """A listening socket could not be bound (the port is taken, the address is not local)."""


def _listen_socket(host: str, port: int) -> socket.socket:
    try:
        return bind_socket(host, port)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def main(args: argparse.Namespace) -> int:
    try:
        config = from_namespace(args)
    except ValueError as exc:  # an invalid option value, named by ReplicaConfig
        print(f"prefix-loadtest replica {args.name}: {exc}", file=sys.stderr)
        return 2
    try:
        serve(config)
    except (CannotListen, OSError) as exc:  # a taken port (HTTP or KV events)
        print(f"prefix-loadtest replica {args.name}: {exc}", file=sys.stderr)
        return 1
    return 0
