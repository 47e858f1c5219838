"""`prefix-router epp`: the endpoint picker process - the router's core without its proxy.

`EppServer` owns a `router.app.RouterApp` for everything but the data path: membership
(discovery, EndpointSlices in Kubernetes), health probes, the load scrape, KV events, peers,
the metrics and the admin listener (``/metrics``, ``/health``, ``/ready`` on ``admin.port``)
start and stop exactly as in ``serve``'s lifespan (`RouterApp.startup` / `shutdown`). In front
of it, one grpc.aio server on ``epp.host:epp.port`` serves the ext_proc stream
(`router.epp.service.ExternalProcessor`) and ``grpc.health.v1`` on the same port.

Order: start: core startup (static membership published at once), readiness loop, gRPC server;
stop: the gRPC server stops accepting and lets open streams finish for ``shutdown.grace_period``
(then cancels them, which releases their attempts), the readiness loop is cancelled, then the
core shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2_grpc

from router.app import RouterApp
from router.discovery import Discovery
from router.epp.service import ExternalProcessor, watch_readiness
from router.settings import Settings

__all__ = ["EppServer", "run"]


class EppServer:
    def __init__(self, settings: Settings, *, discovery: Discovery | None = None) -> None:
        self.settings = settings
        self.core = RouterApp(settings, discovery=discovery)
        self.processor = ExternalProcessor(self.core, settings.epp)
        self.health = health.aio.HealthServicer()
        self.port = 0  # the bound port once started
        self._server: grpc.aio.Server | None = None
        self._ready: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Start everything; returns the bound gRPC port (``epp.port`` 0: the kernel's).
        OSError when the port cannot be bound (everything started is stopped again)."""
        await self.core.startup()
        self._ready = asyncio.create_task(watch_readiness(self.core, self.health),
                                          name="epp-readiness")
        # a BUFFERED body arrives in one message: up to proxy.max_body_bytes (then a 413), not
        # grpc's 4 MiB default; no SO_REUSEPORT: a port in use is an error, not shared
        limit = self.settings.proxy.max_body_bytes + (1 << 20)
        server = self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(self.processor, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        e = self.settings.epp
        host = e.host or self.settings.listen.host
        bind = f"[{host}]:{e.port}" if ":" in host else f"{host}:{e.port}"
        try:
            self.port = server.add_insecure_port(bind)
        except RuntimeError as exc:  # grpc's way of saying the bind failed
            await self.stop()
            raise OSError(f"epp.port: cannot listen on {bind}") from exc
        await server.start()
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(self.settings.shutdown.grace_period)
            self._server = None
        if self._ready is not None:
            self._ready.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ready
            self._ready = None
        await self.core.shutdown()


async def _serve(settings: Settings) -> None:
    server = EppServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        port = await server.start()
    except OSError as exc:
        print(f"prefix-router epp: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    e = settings.epp
    print(f"prefix-router epp: ext_proc + grpc.health.v1 on {e.host or settings.listen.host}:"
          f"{port}" + (f", /metrics on :{settings.admin.port}" if settings.admin.enabled
                       else ""), flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def run(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, then stop in order (see the module docstring)."""
    asyncio.run(_serve(settings))
