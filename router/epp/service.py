"""The gRPC side of the endpoint picker: ``envoy.service.ext_proc.v3.ExternalProcessor`` and
``grpc.health.v1.Health`` on one grpc.aio server.

`ExternalProcessor.Process` is one bidirectional stream per HTTP request: each message goes
through the stream's `router.epp.exchange.Exchange` and its answers are sent in order. However
the stream ends - the gateway half-closes it, an immediate response ends the exchange, a
protocol violation (INVALID_ARGUMENT), a failure inside the EPP (INTERNAL, logged), the gateway
cancelling it - ``Exchange.close`` runs in a ``finally`` and releases the request's attempt,
and the access log gets the request's line.

Health (GIE protocol v1.0.0, "Health Checking"): ``liveness`` is SERVING while the process
runs; ``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor`` and the overall service
``""`` are SERVING while at least one replica is available (`router.app.RouterApp.ready`), else
NOT_SERVING - refreshed by `watch_readiness` every ``interval`` seconds, a loop the EPP's
lifespan starts and cancels.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse
from grpc_health.v1 import health, health_pb2

from router.app import RouterApp
from router.epp.exchange import Exchange, ProtocolViolation
from router.settings import EppSettings

__all__ = ["EXT_PROC_SERVICE", "ExternalProcessor", "READINESS_SERVICES", "watch_readiness"]

log = logging.getLogger("prefix_router")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READINESS_SERVICES = ("", "readiness", EXT_PROC_SERVICE)


class ExternalProcessor(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(self, core: RouterApp, settings: EppSettings) -> None:
        self.core = core
        self.settings = settings
        self.open = 0  # streams being processed now

    async def Process(self, request_iterator: AsyncIterator[ProcessingRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ProcessingResponse]:
        exchange = Exchange(self.core, self.settings)
        t0 = time.perf_counter()
        self.open += 1
        try:
            async for msg in request_iterator:
                for answer in await exchange.handle(msg):
                    yield answer
                if exchange.done:
                    return
        except ProtocolViolation as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("epp: processing a request failed")
            await context.abort(grpc.StatusCode.INTERNAL, "the endpoint picker failed")
        finally:
            self.open -= 1
            exchange.close()
            access_log = self.core.access_log
            if access_log is not None and exchange.record.path:
                exchange.record.duration_ms = round((time.perf_counter() - t0) * 1000, 3)
                access_log.emit(exchange.record)


async def watch_readiness(core: RouterApp, servicer: health.aio.HealthServicer,
                          interval: float = 0.5) -> None:
    """Keep the readiness services' status in step with the replicas' availability."""
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    await servicer.set("liveness", serving)
    last: bool | None = None
    while True:
        ready = core.ready
        if ready is not last:
            for name in READINESS_SERVICES:
                await servicer.set(name, serving if ready else not_serving)
            last = ready
        await asyncio.sleep(interval)
