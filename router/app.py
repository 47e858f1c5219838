"""The router's ASGI application: the only place the pieces are wired together.

Request path (plain ASGI, no middleware stack):

    /v1/*   auth -> in-flight cap (429) -> read body (413) -> validate (400) -> model pool
            (models.ModelPools.select: 404 model_not_found / 503) -> routing.Router.route (key,
            cache_aware pipeline or policy, LoRA affinity) -> proxy.Forwarder.forward (retry
            before first byte, relay, disconnect); everything after the pool sees only its
            replicas
            GET /v1/models is answered here: union over available replicas, deduplicated by id;
            a pool with prefill and decode instances (`router.disagg_routing.split`) is routed
            over its prefill instances and served in two phases by `router.disagg.TwoPhase`
    /health 200 while the process runs        /ready 200 with >= 1 available replica, else 503
    /metrics Prometheus text (on the admin listener instead when `admin.port` is set)

The body is parsed once, for validation and the routing key; the raw bytes are what is sent on.
Errors raised anywhere before the first response byte are `RouterError`s answered in one place
(`_answer_error`) in OpenAI error format. Connection-level limits (head and body deadlines, head
sizes, connection caps) are enforced below this app by `router.limits`, through the app's
`connection_guard`.

Lifespan: startup creates the upstream pool of the proxied requests (`router.upstream`) and the
aiohttp sessions (/v1/models fan-out, control plane), starts the KV-event subscribers when
`routing.kv_events` is on (`router.kv_events`: one SUB loop per replica, which follow every
membership and health change) and the peer transport when `routing.peers` is on or the app is
one of several `--workers` (`router.peers.service`: a PUB socket, a SUB socket to the other
router processes or sibling workers, a heartbeat),
publishes the static membership at once, then starts discovery,
health probes, the load scrape and the optional admin listener as tasks; shutdown cancels and
awaits them, stops the subscribers and the peer transport and closes the pool and the sessions.
Constructing a RouterApp starts nothing, so tests can build many.

`app_factory()` builds the app from the settings file named by `SETTINGS_ENV`, which is how
`uvicorn --workers N` processes get their configuration. Every worker computes the same routing
decision for the same key and membership because the policy is a pure function of both (loads
differ per worker: each counts its own in-flight requests plus the shared scraped gauges, and
the sibling workers' in-flight requests and served prompts over the peer transport - by default
between the workers of one process (`Settings.workers_share`), with `routing.peers` also other
processes').
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import uvicorn

from prefix_asgi import Receive, Scope, Send, send_bytes, send_json, serve_lifespan
from router.accesslog import CLIENT_CLOSED, AccessLog, AccessRecord
from router.auth import ClientAuth, upstream_authorization
from router.body import PROMPT_FIELDS, ClientGone, read_body, validate_body
from router.disagg import GENERATE_PATHS, TwoPhase
from router.disagg_routing import Phases, split
from router.discovery import Discovery, make_discovery
from router.errors import (
    ModelNotFound,
    NoReplicaAvailable,
    NotFound,
    RequestTimeout,
    RouterError,
    TooManyRequests,
    UpstreamError,
    error_body,
)
from router.health import HealthMonitor
from router.limits import ConnectionGuard, refused_by
from router.metrics import RouterMetrics
from router.models import ModelPools, Pool, PoolStatus
from router.policy import Branch
from router.proxy import Forwarder, Upstream, make_session
from router.replicas import EndpointLike, ReplicaSet
from router.routing import Routed, Router
from router.settings import PEER_DIR_ENV, Settings, SettingsError, settings_from_env
from router.upstream import UpstreamPool
from router.usage import UsageTap

if TYPE_CHECKING:  # router.tracing imports opentelemetry: only loaded when tracing is on
    from router.kv_events.service import KvEvents  # pyzmq, msgpack: only with kv_events on
    from router.peers.service import PeerService  # pyzmq, msgpack: only with peers on
    from router.tracing import RequestTrace, Tracing

log = logging.getLogger("prefix_router")

_REJECT_REASONS = {400: "invalid_request", 401: "unauthorized", 404: "not_found",
                   413: "body_too_large", 429: "overloaded", 502: "upstream_error",
                   503: "no_replica", 504: "upstream_timeout"}


class RouterApp:
    def __init__(self, settings: Settings, *, discovery: Discovery | None = None,
                 environ: Mapping[str, str] = os.environ) -> None:
        self.settings = settings
        r = settings.routing
        self.metrics = RouterMetrics()
        self.replicas = ReplicaSet((), ring_kind=r.ring, vnodes=r.virtual_nodes)
        self.kv: KvEvents | None = None
        if r.kv_events.enabled:  # only then is the kv extra (pyzmq, msgpack) imported
            from router.kv_events.service import KvEvents

            self.kv = KvEvents(settings, self.metrics)
            self.router = Router(r, self.replicas, self.kv.index, self.kv.exact)
        else:
            self.router = Router(r, self.replicas)
        self.peers: PeerService | None = None
        # a worker of `serve --workers N`: its siblings' sockets are in the parent's directory
        siblings = environ.get(PEER_DIR_ENV) if settings.workers_share else None
        if r.peers.enabled or siblings:  # only then is the kv extra imported
            from router.peers.service import PeerService

            self.peers = PeerService(settings, self.router, self.metrics, siblings=siblings)
        self.policy = self.router.policy
        self.pools = ModelPools()
        self.key_config = self.router.key_config
        self._key_headers = (self.key_config.key_header.encode(),
                             self.key_config.session_header.encode())
        self.auth = ClientAuth(settings.auth.client_keys(environ))
        self.upstream_auth = upstream_authorization(settings.auth.upstream_key(environ))
        auth = self.upstream_auth
        self.health = HealthMonitor(
            settings.health, settings.scrape, self.replicas, self.metrics,
            on_change=self._publish_states,
            models_headers={auth[0].decode("latin-1"): auth[1].decode("latin-1")} if auth else None)
        self.discovery = discovery
        self.forwarder: Forwarder | None = None
        self.disagg: TwoPhase | None = None  # made with the forwarder, at startup
        self._session: aiohttp.ClientSession | None = None
        self._pool: UpstreamPool | None = None
        self._control: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._admin: uvicorn.Server | None = None
        self._seq = 0
        self._open = 0
        self.access_log = AccessLog() if settings.logging.access_log else None
        self.tracing: Tracing | None = None  # made in startup when tracing is on
        self._environ = environ
        # found by the http= protocol of `prefix-router serve` (router.limits)
        self.connection_guard = ConnectionGuard(settings.limits, self.metrics, self.access_log)
        self._metrics_here = not settings.admin.enabled

    # membership ------------------------------------------------------------------------------

    def publish(self, endpoints: Iterable[EndpointLike]) -> None:
        """Discovery callback: replace the membership (states of survivors are kept)."""
        before = {s.name for s in self.replicas.states()}
        self.replicas.update_membership(list(endpoints))
        gone = before - {s.name for s in self.replicas.states()}
        self.health.forget(gone)
        self.router.forget(gone)
        if self.peers is not None:
            self.peers.forget(gone)
        self._publish_states()

    def _publish_states(self) -> None:
        states = self.replicas.states()
        self.metrics.set_membership({s.name: (s.healthy, s.draining) for s in states})
        if self.kv is not None:
            self.kv.update(states)

    @property
    def ready(self) -> bool:
        return any(s.available for s in self.replicas.states())

    # lifespan --------------------------------------------------------------------------------

    async def startup(self) -> None:
        s = self.settings
        self.tracing = start_tracing(s, self._environ)
        self._session = make_session(s.proxy)
        self._pool = UpstreamPool(keepalive=4.0)
        self._control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                              cookie_jar=aiohttp.DummyCookieJar())
        self.forwarder = Forwarder(Upstream(self._pool, self.replicas, self.health,
                                            self.metrics, s.proxy, self.upstream_auth))
        self.disagg = TwoPhase(s, self.router, self.forwarder, self.metrics)
        if self.kv is not None:
            await self.kv.start()
        if self.peers is not None:
            await self.peers.start()
        if s.discovery.type == "static" and s.replicas:
            self.publish(s.replicas)  # ready from the first request, before any task ran
        discovery = self.discovery or make_discovery(s)
        self._tasks = [asyncio.create_task(discovery.run(self.publish), name="discovery"),
                       asyncio.create_task(self.health.run_probes(self._control), name="probes")]
        if s.scrape.enabled:
            self._tasks.append(asyncio.create_task(self.health.run_scrapes(self._control),
                                                   name="scrape"))
        if self.access_log is not None:
            self._tasks.append(asyncio.create_task(_flush_every_second(self.access_log),
                                                   name="access-log"))
        if s.admin.enabled:
            await self._start_admin()

    async def shutdown(self) -> None:
        if self._admin is not None:
            # let the admin server close its listener itself before anything is cancelled
            self._admin.should_exit = True
            admin = [t for t in self._tasks if t.get_name() == "admin"]
            if admin:
                await asyncio.wait(admin, timeout=5.0)
            self._admin = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.kv is not None:
            await self.kv.stop()
        if self.peers is not None:
            await self.peers.stop()
        for session in (self._session, self._control):
            if session is not None:
                await session.close()
        if self._pool is not None:
            await self._pool.close()
        self._session = self._control = self._pool = None
        if self.tracing is not None:  # flushes queued spans; the export may wait on the network
            tracing, self.tracing = self.tracing, None
            await asyncio.to_thread(tracing.shutdown)

    async def _start_admin(self) -> None:
        admin = self.settings.admin
        sock = socket.socket(socket.AF_INET6 if ":" in (admin.host or "") else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # every uvicorn worker binds the admin port; the kernel spreads scrapes over them
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((admin.host or self.settings.listen.host, admin.port or 0))
        config = uvicorn.Config(self.admin_app, lifespan="off", log_level="warning",
                                interface="asgi3", access_log=False)
        server = self._admin = uvicorn.Server(config)
        # _serve skips capture_signals: the outer server owns SIGINT/SIGTERM
        serve = getattr(server, "_serve", server.serve)
        self._tasks.append(asyncio.create_task(serve(sockets=[sock]), name="admin"))
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)

    # HTTP ------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith("/v1/"):
                await self._api(scope, receive, send)
            elif not await self._own_route(path, send, metrics=self._metrics_here):
                await self._answer_error(send, NotFound(f"no route for {path}"))
        elif kind == "lifespan":
            await serve_lifespan(receive, send, self.startup, self.shutdown, log)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1000})

    async def admin_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not await self._own_route(scope["path"], send,
                                                                  metrics=True):
            await self._answer_error(send, NotFound(f"no route for {scope['path']}"))

    async def _own_route(self, path: str, send: Send, *, metrics: bool) -> bool:
        if path == "/health":
            await send_json(send, 200, {"status": "ok"})
        elif path == "/ready":
            ready = self.ready
            await send_json(send, 200 if ready else 503,
                            {"status": "ready" if ready else "no healthy replica"})
        elif path == "/metrics" and metrics:
            body, ctype = self.metrics.render()
            await send_bytes(send, 200, body, [(b"content-type", ctype.encode())])
        else:
            return False
        return True

    async def _answer_error(self, send: Send, err: RouterError) -> None:
        self.reject(err)
        await send_bytes(send, err.status, error_body(err), err.headers())

    def reject(self, err: RouterError) -> None:
        """Count a request answered with ``err`` instead of a replica's response."""
        reason = "model_not_found" if isinstance(err, ModelNotFound) else _REJECT_REASONS.get(
            err.status, "error")
        self.metrics.reject(reason)

    async def _api(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        method: str = scope["method"]
        path: str = scope["path"]
        record = AccessRecord(method, path)
        trace = None if self.tracing is None else self.tracing.request(scope, record)
        counted = False
        try:
            self.auth.check(scope["headers"])
            if path == "/v1/models" and method == "GET":
                await self._models(scope, send)
                record.status = 200
                return
            if self._open >= self.settings.proxy.max_in_flight:
                raise TooManyRequests("router at max_in_flight; retry shortly", retry_after=1)
            self._open += 1
            counted = True
            await self._route(scope, receive, send, record, trace)
        except RouterError as err:
            record.status = err.status
            await self._answer_error(send, err)
        except ClientGone:
            record.status = CLIENT_CLOSED
            record.limit = refused_by(scope)
            if record.limit is not None:
                # a limits.* deadline ended the body: the guard answered it (and logs the line)
                record.status = RequestTimeout.status
        finally:
            if counted:
                self._open -= 1
            if trace is not None:
                trace.finish(record)
            if self.access_log is not None and record.limit is None:
                record.duration_ms = round((time.perf_counter() - t0) * 1000, 3)
                if record.ttfb_ms is not None:
                    record.ttfb_ms = round(record.ttfb_ms, 3)
                self.access_log.emit(record)

    async def _route(self, scope: Scope, receive: Receive, send: Send,
                     record: AccessRecord, trace: RequestTrace | None) -> None:
        headers = scope["headers"]
        path: str = scope["path"]
        body = await read_body(receive, headers, self.settings.proxy.max_body_bytes)
        record.bytes_in = len(body)
        parsed: dict[str, Any] | None = None
        if scope["method"] == "POST" and path in PROMPT_FIELDS:
            parsed = validate_body(path, headers, body)
        key_hdr, session_hdr = self._key_headers
        key_headers = {n.decode("latin-1"): v.decode("latin-1") for n, v in headers
                       if n == key_hdr or n == session_hdr}
        routed, phases = self.decide_phases(path, key_headers, parsed, record)
        decision = routed.decision
        if trace is not None:
            trace.routed(parsed, routed.key, decision)
        assert self.forwarder is not None, "request before lifespan startup"
        if routed.leader is not None:
            await self.hold(routed.leader, decision.replica)
        try:
            if phases is None:
                await self.forwarder.forward(scope, receive, send, body if body else None,
                                             decision.candidates, record, routed, trace)
            else:
                assert self.disagg is not None and parsed is not None
                await self.disagg.serve(scope, receive, send, parsed, phases, routed, record,
                                        trace)
        finally:
            self.settle(routed, trace)

    def decide(self, path: str, key_headers: Mapping[str, str], parsed: dict[str, Any] | None,
               record: AccessRecord, subset: Callable[[Pool], Pool] | None = None) -> Routed:
        """The routing decision for one validated request (`decide_phases`, its first part):
        what `router.epp` runs for every picked endpoint (a gateway makes one hop: in a
        disaggregated pool the EPP names a prefill instance)."""
        return self.decide_phases(path, key_headers, parsed, record, subset)[0]

    def decide_phases(self, path: str, key_headers: Mapping[str, str],
                      parsed: dict[str, Any] | None, record: AccessRecord,
                      subset: Callable[[Pool], Pool] | None = None
                      ) -> tuple[Routed, Phases | None]:
        """The routing decision for one validated request: the model pool (404
        ``model_not_found`` / 503), then `router.routing.Router.route` among its replicas -
        what ``serve`` runs for every proxied request and `router.epp` for every picked
        endpoint. ``subset`` narrows the pool (the gateway's candidate subset); an empty
        result is a 503. A pool with prefill and decode instances is routed over its prefill
        ones and its `Phases` returned (None otherwise: one phase). Raises `RouterError`;
        records the pool, branch and key source on ``record``. Writes no routing state (the
        returned `Routed` does, from outcomes)."""
        model = parsed.get("model") if parsed is not None else None
        pool = self.pools.select(model, self.replicas.states())
        record.model = pool.label
        if pool.status is PoolStatus.NOT_FOUND:
            raise ModelNotFound()
        if pool.status is PoolStatus.PENDING:
            raise NoReplicaAvailable("the model lists of some replicas are not known yet",
                                     retry_after=self._retry_after())
        if pool.status is PoolStatus.DOWN:
            raise NoReplicaAvailable("no healthy replica serves the requested model",
                                     retry_after=self._retry_after())
        if subset is not None:
            pool = subset(pool)
            if not any(r.available for r in pool.members):
                raise NoReplicaAvailable("no healthy replica in the gateway's endpoint subset",
                                         retry_after=self._retry_after())
        # a pool with prefill and decode instances: two phases, routed over its prefill ones
        phases = split(pool) if parsed is not None and path in GENERATE_PATHS else None
        if phases is not None:
            assert self.disagg is not None, "request before lifespan startup"
            self.disagg.check_decode(phases)
            pool = phases.prefill
        self._seq += 1
        if self.peers is not None:
            self.peers.catch_up()
        routed = self.router.route(path, key_headers, parsed, self._seq,
                                   UsageTap() if parsed is not None else None, pool)
        if routed is None:
            raise NoReplicaAvailable("no healthy replica", retry_after=self._retry_after())
        decision, key = routed.decision, routed.key
        record.branch = decision.branch.value
        record.key_source = key.source.value
        if decision.branch is Branch.SPILL:
            self.metrics.spill(decision.replica, pool.label)
        ring_key = key.ring_key
        if ring_key is not None:
            self.metrics.observe_key(ring_key)
        return routed, phases

    def settle(self, routed: Routed, trace: RequestTrace | None = None) -> None:
        """A request's attempts are over: the predicted-vs-reported cached tokens of the
        replica that served it (nothing when none did)."""
        served = routed.served_by
        if served is not None:
            usage = routed.tap.usage() if routed.tap else None
            self.metrics.cached_tokens(served, routed.predicted, usage)
            if trace is not None:
                trace.outcome(usage, routed.predicted if self.router.index is not None
                              else None)

    async def hold(self, leader: Routed, replica: str) -> None:
        """Wait until ``leader`` (prefilling this request's prefix on ``replica``) answers, at
        most ``routing.hold_timeout``: then the prefix is cached there and this request
        prefills only the rest (`router.routing.Routed.leader`)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def wake() -> None:
            if not done.done():
                done.set_result(None)

        t0 = loop.time()
        if not leader.when_answered(wake):
            return
        outcome = "answered"
        try:
            await asyncio.wait_for(done, self.settings.routing.hold_timeout)
        except TimeoutError:
            outcome = "timeout"
        self.metrics.hold(replica, outcome, loop.time() - t0)

    def _retry_after(self) -> int:
        return max(1, round(min(self.settings.health.interval,
                                self.settings.health.readmit_backoff)))

    async def _models(self, scope: Scope, send: Send) -> None:
        available = [s for s in self.replicas.states() if s.available]
        if not available or self._session is None or self.forwarder is None:
            raise NoReplicaAvailable("no healthy replica", retry_after=self._retry_after())
        headers = self.forwarder.request_headers(scope["headers"])
        timeout = aiohttp.ClientTimeout(total=self.settings.health.timeout * 5,
                                        sock_connect=self.settings.proxy.connect_timeout)
        session = self._session

        async def fetch(url: str) -> list[Any] | None:
            try:
                async with session.get(url + "/v1/models", headers=headers, timeout=timeout,
                                       allow_redirects=False) as resp:
                    if resp.status != 200:
                        return None
                    data = (await resp.json(content_type=None)).get("data")
                    return data if isinstance(data, list) else None
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError, AttributeError):
                return None

        results = await asyncio.gather(*(fetch(s.url) for s in available))
        if all(r is None for r in results):
            raise UpstreamError("no replica answered /v1/models")
        seen: set[str] = set()
        data: list[Any] = []
        for models in results:
            for m in models or ():
                mid = m.get("id") if isinstance(m, dict) else None
                if isinstance(mid, str) and mid not in seen:
                    seen.add(mid)
                    data.append(m)
        await send_json(send, 200, {"object": "list", "data": data})


async def _flush_every_second(access_log: AccessLog) -> None:
    try:
        while True:
            await asyncio.sleep(1.0)
            access_log.flush()
    finally:
        access_log.flush()


def start_tracing(settings: Settings, environ: Mapping[str, str]) -> Tracing | None:
    """The process's tracer when `tracing.enabled` (and OTEL_SDK_DISABLED is not true), else
    None; the only place router.tracing, and so opentelemetry, is imported."""
    t = settings.tracing
    if not t.enabled or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:
        from router.tracing import Tracing
    except ImportError as exc:
        raise SettingsError(f"tracing.enabled: true needs the otel extra (pip install "
                            f"'prefix-router[otel]'), got ImportError: {exc}") from exc
    return Tracing(t, settings.routing.policy, environ)


def create_app(settings: Settings, *, discovery: Discovery | None = None) -> RouterApp:
    return RouterApp(settings, discovery=discovery)


def app_factory() -> RouterApp:
    """uvicorn factory for worker processes: settings come from the file `SETTINGS_ENV` names."""
    return create_app(settings_from_env())


__all__ = ["RouterApp", "app_factory", "create_app", "start_tracing"]
