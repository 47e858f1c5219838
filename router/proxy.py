"""Forward one request to a replica and relay the response; retry only before the first byte.

Algorithm for a request whose policy Decision lists candidates c0, c1, ...:

1. For each of the first `proxy.max_attempts` candidates that is still available: send the raw
   body bytes (never re-serialised) with the request headers minus hop-by-hop ones, through the
   app's `router.upstream.UpstreamPool` (keep-alive connections, one pool per app).
2. A failure before anything reached the client - connect refused or timed out, no response
   headers within `first_byte_timeout`, the connection dying before the first body chunk - or a
   502/503 answer, moves on to the next candidate while one remains
   (`retries_total{replica,reason}`); the failed replica's passive-health count goes up and its
   connection is closed, so a replica that did start generating aborts. Nothing has been sent to
   the client yet at that point - that is the retry invariant. (Status and headers are held back
   until the first body chunk arrived, which is what makes the first-chunk case retryable.)
3. Otherwise the response is relayed: status and headers (hop-by-hop dropped, `x-prefix-router-
   replica` added) once the first body chunk arrived, then every chunk as it arrives
   (`readany`, no buffering). From here on nothing is retried: an upstream failure or idle timeout
   ends an SSE stream with `data: {"error": ...}` and a non-SSE body by aborting the connection.
   So does the end of the shutdown grace period, when uvicorn cancels the request's task.

Timeouts: `connect_timeout` for the TCP connect; `first_byte_timeout` for the response head and
the first body chunk (each wait); `idle_timeout` between later chunks, enforced by an
`IdleWatchdog` that arms one timer per idle period rather than one per chunk.

Client disconnect: under the router's own HTTP protocol (`router.limits`) the request's scope
has a `router.limits.DISCONNECT_HOOK` slot and the protocol calls the callback put there when
the connection is lost; under any other server `receive()` is awaited by a `DisconnectWatch`
(no Task) while the upstream exchange runs and reports ``http.disconnect``. Either way the
request task is cancelled, which closes (not releases) the upstream connection so vLLM sees the
disconnect and aborts generation. A disconnect is never retried.

Tracing (`router.tracing`, when on): each attempt starts a CLIENT span before dispatch - the
request then carries that span as its ``traceparent`` instead of the client's - and ends it in
the attempt's ``finally`` with the replica's status, the first-byte time and the failure reason;
a client disconnect is reported too. Off, the trace is None: two ``is None`` tests per attempt.

In-flight accounting: `ReplicaState.in_flight` and `prefix_router_in_flight` go up at dispatch
and down in a `finally` when the attempt ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import aiohttp
from yarl import URL

from prefix_asgi import Receive, Scope, Send, advance
from router.accesslog import CLIENT_CLOSED, AccessRecord
from router.errors import (
    NoReplicaAvailable,
    StreamCancelled,
    UpstreamConnectError,
    UpstreamError,
    sse_error_event,
    translate_upstream,
    upstream_error,
)
from router.health import HealthMonitor
from router.limits import DISCONNECT_HOOK, DISCONNECTED
from router.metrics import RouterMetrics
from router.replicas import ReplicaSet, ReplicaState
from router.settings import ProxySettings
from router.upstream import Origin, Response, UpstreamPool, origin_of
from router.usage import UsageTap


class Attempts(Protocol):
    """What the caller learns of one request's attempts, as they happen (the outcome that
    routing state is written from). Each method is called from the proxy's hot path."""

    tap: UsageTap | None  # fed every relayed body chunk of the answering attempt

    def started(self, replica: ReplicaState) -> None:
        """An attempt on ``replica`` was dispatched."""

    def served(self, replica: ReplicaState, status: int) -> None:
        """``replica``'s response head and first body chunk arrived and are being relayed."""

    def ended(self, replica: ReplicaState) -> None:
        """The attempt on ``replica`` is over, however it ended (after `started`)."""


__all__ = [
    "AttemptTrace", "Attempts", "DisconnectWatch", "Forwarder", "HOP_BY_HOP", "IdleWatchdog",
    "REPLICA_HEADER", "RETRY_STATUSES", "Upstream", "attempt_plan", "make_session",
    "strip_hop_by_hop"
]


class AttemptTrace(Protocol):
    """What the proxy reports of each attempt to a request's trace (`router.tracing.
    RequestTrace`). Absent (None) when tracing is off: two `is None` tests per attempt."""

    def attempt(self, replica: str, url: URL, method: str,
                headers: list[tuple[str, str]]) -> list[tuple[str, str]]: ...

    def attempt_end(self, status: int | None, ttfb_ms: float | None, failure: str | None,
                    retried: bool) -> None: ...

    def disconnected(self) -> None: ...


HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate",
                        b"proxy-authorization", b"proxy-connection", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade"})
# Not hop-by-hop, but recomputed by the client library from the URL / body it sends; the body is
# already complete, so a client's Expect: 100-continue has been answered and must not go on.
_REQUEST_RECOMPUTED = frozenset({b"host", b"content-length", b"expect"})
RETRY_STATUSES = frozenset({502, 503})
REPLICA_HEADER = b"x-prefix-router-replica"
_URL_CACHE_MAX = 4096


def strip_hop_by_hop(headers: Iterable[tuple[bytes, bytes]],
                     also: frozenset[bytes] = frozenset()) -> list[tuple[bytes, bytes]]:
    """Headers minus hop-by-hop ones: the fixed set, proxy-*, and any named in Connection.

    Names must be lowercase (ASGI guarantees it for requests; responses are lowered here).
    """
    out = []
    named: set[bytes] | None = None
    for name, value in headers:
        lname = name.lower()
        if lname == b"connection":
            named = (named or set()) | {t.strip().lower() for t in value.split(b",")}
        elif not (lname in HOP_BY_HOP or lname in also or lname.startswith(b"proxy-")):
            out.append((lname, value))
    if named:
        out = [h for h in out if h[0] not in named]
    return out


@dataclass(frozen=True)
class Upstream:
    """What the proxy needs from the app, set up in the lifespan."""

    pool: UpstreamPool
    replicas: ReplicaSet
    health: HealthMonitor
    metrics: RouterMetrics
    settings: ProxySettings
    upstream_auth: tuple[bytes, bytes] | None = None


def make_session(settings: ProxySettings) -> aiohttp.ClientSession:
    """The app's aiohttp client for what is not proxied request by request (``GET /v1/models``
    fan-out): one pool per app, keep-alive shorter than uvicorn's 5 s default so a pooled
    connection is never reused just as vLLM closes it. Proxied requests go through
    `router.upstream.UpstreamPool` (the same keep-alive rule)."""
    connector = aiohttp.TCPConnector(limit=settings.max_in_flight + 16,
                                     limit_per_host=settings.max_in_flight,
                                     keepalive_timeout=4.0, ttl_dns_cache=10)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                 skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                                 timeout=aiohttp.ClientTimeout(total=None),
                                 cookie_jar=aiohttp.DummyCookieJar())


class _Failable(Protocol):
    def set_exception(self, exc: BaseException) -> None: ...


class IdleWatchdog:
    """Fails a response body with TimeoutError once no chunk arrived for `idle` seconds.

    One timer per `idle` period that re-arms itself from the time of the last chunk, instead of
    a per-read timer that is cancelled and re-created on every socket read (measurable per
    relayed chunk). The reader sets `last` after each chunk.
    """

    __slots__ = ("content", "handle", "idle", "last", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, content: _Failable,
                 idle: float) -> None:
        self.loop = loop
        self.content = content
        self.idle = idle
        self.last = loop.time()
        self.handle = loop.call_later(idle, self._check)

    def _check(self) -> None:
        quiet = self.loop.time() - self.last
        if quiet >= self.idle:
            self.content.set_exception(TimeoutError(f"no chunk for {self.idle:g}s"))
        else:
            self.handle = self.loop.call_later(self.idle - quiet, self._check)

    def cancel(self) -> None:
        self.handle.cancel()


class DisconnectWatch:
    """Awaits the ASGI ``receive()`` in the background and calls ``on_disconnect`` if it
    returns ``http.disconnect`` - without an asyncio Task.

    A Task per request (create, schedule, cancel, one more loop pass to unwind the
    cancellation) costs router CPU on every request (``scripts/bench_stepping.py``). This steps
    the ``receive()`` coroutine itself with `prefix_asgi.advance`, the way a Task does: each step
    runs it to its next await and returns the future it waits on; the future's done-callback
    steps it again. ``close()`` detaches and closes the coroutine
    (its ``finally`` blocks run, e.g. uvicorn's event-waiter cleanup).
    """

    __slots__ = ("_coro", "_done", "_fut", "_loop", "_on_disconnect")

    def __init__(self, receive: Receive, on_disconnect: Callable[[], None]) -> None:
        self._on_disconnect = on_disconnect
        self._loop = asyncio.get_running_loop()
        self._fut: asyncio.Future[Any] | None = None
        self._done = False
        self._coro = receive().__await__()
        self._step()

    def _step(self, _fut: object = None) -> None:
        if self._done:
            return
        self._fut = None
        try:
            waiting = advance(self._coro)
        except StopIteration as stop:
            self._done = True
            msg = stop.value
            if isinstance(msg, MutableMapping) and msg.get("type") == "http.disconnect":
                self._on_disconnect()
            return
        except BaseException:  # receive() failed: nothing left to watch
            self._done = True
            return
        if waiting is None:  # a bare yield (sleep(0)): step again on the next loop pass
            self._loop.call_soon(self._step)
        else:
            self._fut = waiting
            waiting.add_done_callback(self._step)

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        if self._fut is not None:
            self._fut.remove_done_callback(self._step)
            self._fut = None
        with contextlib.suppress(BaseException):
            self._coro.close()


def attempt_plan(candidates: Iterable[str], replicas: ReplicaSet,
                 max_attempts: int) -> list[ReplicaState]:
    """The replicas a request is tried on, in order: the decision's pick, then its still-
    available candidates, at most ``max_attempts`` (the retry order `router.epp` hands the
    gateway too). O(candidates)."""
    plan: list[ReplicaState] = []
    for name in candidates:
        replica = replicas.get(name)
        if replica is not None and (not plan or replica.available):
            plan.append(replica)
            if len(plan) >= max_attempts:
                break
    return plan


class _Target(NamedTuple):
    """One replica URL plus a request's path and query, as the upstream client takes it."""

    origin: Origin
    target: bytes  # raw path and query: the request line's target
    text: str  # the whole URL (tracing)


class Forwarder:
    def __init__(self, up: Upstream) -> None:
        self.up = up
        self._targets: dict[tuple[str, bytes, bytes], _Target] = {}

    def _target(self, base: str, raw_path: bytes, query: bytes) -> _Target:
        k = (base, raw_path, query)
        t = self._targets.get(k)
        if t is None:
            if len(self._targets) >= _URL_CACHE_MAX:
                self._targets.clear()
            target = raw_path + (b"?" + query if query else b"")
            url = URL(base)
            t = self._targets[k] = _Target(
                origin_of(url.scheme, url.raw_host or "", url.explicit_port),
                target, base + target.decode("latin-1"))
        return t

    def raw_request_headers(self, scope_headers: Iterable[tuple[bytes, bytes]]
                            ) -> list[tuple[bytes, bytes]]:
        """The headers sent on: hop-by-hop and recomputed ones dropped, the upstream key in
        place of the client's Authorization when one is configured."""
        headers = strip_hop_by_hop(scope_headers, _REQUEST_RECOMPUTED)
        auth = self.up.upstream_auth
        if auth is not None:
            headers = [h for h in headers if h[0] != b"authorization"]
            headers.append(auth)
        return headers

    def request_headers(self, scope_headers: Iterable[tuple[bytes, bytes]]
                        ) -> list[tuple[str, str]]:
        return [(n.decode("latin-1"), v.decode("latin-1"))
                for n, v in self.raw_request_headers(scope_headers)]

    async def forward(self, scope: Scope, receive: Receive, send: Send, body: bytes | None,
                      candidates: Iterable[str], record: AccessRecord,
                      attempts: Attempts | None = None,
                      trace: AttemptTrace | None = None,
                      headers: Iterable[tuple[bytes, bytes]] | None = None) -> None:
        """Proxy with retries; watches for client disconnect. Raises RouterError before any
        byte was sent (the caller answers it); returns once the response ended. ``headers``
        replaces the client's request headers (before hop-by-hop ones are dropped)."""
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def on_disconnect() -> None:
            nonlocal gone
            gone = True
            task.cancel()

        watch: DisconnectWatch | None = None
        if DISCONNECT_HOOK not in scope:  # another server: watch receive()
            watch = DisconnectWatch(receive, on_disconnect)
        elif scope[DISCONNECT_HOOK] == DISCONNECTED:  # lost already: as receive() would say
            on_disconnect()
        else:  # the protocol calls on_disconnect (router.limits)
            scope[DISCONNECT_HOOK] = on_disconnect
        try:
            await self._attempts(scope, send, body, candidates, record, attempts, trace,
                                 scope["headers"] if headers is None else headers)
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            record.status = CLIENT_CLOSED
            if trace is not None:
                trace.disconnected()
        finally:
            if watch is not None:
                watch.close()
            elif scope[DISCONNECT_HOOK] is on_disconnect:
                scope[DISCONNECT_HOOK] = None

    async def _attempts(self, scope: Scope, send: Send, body: bytes | None,
                        candidates: Iterable[str], record: AccessRecord,
                        hooks: Attempts | None, trace: AttemptTrace | None,
                        client_headers: Iterable[tuple[bytes, bytes]]) -> None:
        up = self.up
        headers = self.raw_request_headers(client_headers)
        method = scope["method"]
        raw_path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        # the last attempt relays even a 502/503 (there is nobody left to retry on)
        plan = attempt_plan(candidates, up.replicas, up.settings.max_attempts)
        for tried, replica in enumerate(plan, 1):
            name = replica.name
            last = tried == len(plan)
            record.replica, record.attempts = name, tried
            target = self._target(replica.url, raw_path, query)
            try:
                retry_reason = await self._one(replica, method, target, headers, body, send,
                                               record, last, hooks, trace)
            except UpstreamError as exc:
                if not exc.before_response:
                    raise
                if last:
                    if isinstance(exc, UpstreamConnectError):
                        raise NoReplicaAvailable("no replica reachable", retry_after=1) from exc
                    raise
                retry_reason = exc.reason
            if retry_reason is None:
                return
            up.metrics.retry(name, retry_reason)
        raise NoReplicaAvailable("no replica reachable", retry_after=1)

    async def _one(self, replica: ReplicaState, method: str, target: _Target,
                   headers: list[tuple[bytes, bytes]], body: bytes | None, send: Send,
                   record: AccessRecord, last: bool, hooks: Attempts | None,
                   trace: AttemptTrace | None) -> str | None:
        """One attempt. Returns a retry reason, or None once the response was relayed."""
        up = self.up
        s = up.settings
        name = replica.name
        if trace is not None:
            traced = trace.attempt(name, URL(target.text, encoded=True), method,
                                   [(n.decode("latin-1"), v.decode("latin-1"))
                                    for n, v in headers])
            headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in traced]
        replica.in_flight += 1
        up.metrics.dispatched(name)
        if hooks is not None:
            hooks.started(replica)
        t0 = time.perf_counter()
        ttfb: float | None = None
        status = CLIENT_CLOSED  # what the metric says if we are cancelled before knowing better
        resp: Response | None = None
        failure: str | None = "cancelled"  # for the trace: why the attempt did not succeed
        try:
            try:
                try:
                    resp = await up.pool.request(
                        target.origin, method, target.target, headers, body,
                        connect_timeout=s.connect_timeout, read_timeout=s.first_byte_timeout)
                except Exception as exc:  # translate_upstream's mapping, free when nothing raised
                    err = upstream_error(exc, name, "connect/headers", before_response=True)
                    if err is None:
                        raise
                    raise err from exc
            except UpstreamError as exc:
                status, failure = exc.status, exc.reason
                up.health.record_failure(replica, exc.reason)
                raise
            status = resp.status
            if status in RETRY_STATUSES and not last:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    await resp.read(s.first_byte_timeout)
                up.health.record_failure(replica, "5xx")
                failure = f"status_{status}"
                return failure
            try:
                ttfb, broken = await self._relay(replica, resp, send, record, t0, hooks)
            except UpstreamError as exc:
                status, failure = exc.status, exc.reason
                up.health.record_failure(replica, exc.reason)
                raise
            except asyncio.CancelledError:
                status = CLIENT_CLOSED
                raise
            failure = broken
            if broken is not None:
                up.health.record_failure(replica, broken)
            elif status >= 500:
                up.health.record_failure(replica, "5xx")
            else:
                up.health.record_success(replica)
            return None
        finally:
            replica.in_flight -= 1
            if hooks is not None:
                hooks.ended(replica)
            if resp is not None:
                if resp.is_eof():
                    resp.release()
                else:  # half-read: never back to the pool; closing makes vLLM abort
                    resp.close()
            record.status = status
            up.metrics.finished(name, record.branch or "", status, ttfb, time.perf_counter() - t0,
                                record.model)
            if trace is not None:
                relayed = record.ttfb_ms is not None
                trace.attempt_end(None if resp is None else resp.status, record.ttfb_ms,
                                  failure, not (last or relayed or failure == "cancelled"))

    async def _relay(self, replica: ReplicaState, resp: Response, send: Send,
                     record: AccessRecord, t0: float, hooks: Attempts | None
                     ) -> tuple[float, str | None]:
        """Relay status, headers and body. Returns the time to the first body byte and, if the
        upstream failed after the response started, the failure reason."""
        headers = strip_hop_by_hop(resp.headers)
        if self.up.settings.replica_header:
            headers.append((REPLICA_HEADER, replica.name.encode()))
        try:
            first = await resp.read_chunk(self.up.settings.first_byte_timeout)
        except Exception as exc:  # translate_upstream's mapping, free when nothing raised
            err = upstream_error(exc, replica.name, "first byte", before_response=True)
            if err is None:
                raise
            raise err from exc
        ttfb = time.perf_counter() - t0
        record.ttfb_ms = ttfb * 1000  # here, not by the caller: a cancelled relay keeps it
        tap = None
        if hooks is not None:
            hooks.served(replica, resp.status)
            tap = hooks.tap
            if tap is not None:
                tap.feed(first)
        if not first or resp.is_eof():
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            await send({"type": "http.response.body", "body": first})
            record.bytes_out = len(first)
            return ttfb, None
        sse = resp.content_type == "text/event-stream"
        loop = asyncio.get_running_loop()
        watchdog = IdleWatchdog(loop, resp, self.up.settings.idle_timeout)
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        sent = len(first)
        try:
            with translate_upstream(replica.name, "stream"):
                while True:
                    chunk = await resp.read_chunk()
                    if not chunk:
                        break
                    watchdog.last = loop.time()
                    sent += len(chunk)
                    if tap is not None:
                        tap.feed(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except asyncio.CancelledError:
            # the shutdown grace period ran out (uvicorn cancels the task) or the client left
            # (then uvicorn drops the write): an SSE client still gets an error event and a
            # properly ended stream instead of a bare cut
            if sse:
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": sse_error_event(
                        StreamCancelled("the router ended the stream: it is shutting down"))})
            raise
        except UpstreamError as exc:
            record.bytes_out = sent
            if sse:
                await send({"type": "http.response.body", "body": sse_error_event(exc)})
            # else: returning with the body unfinished makes uvicorn abort the connection,
            # so the client sees a truncated response rather than a complete-looking one
            return ttfb, exc.reason
        finally:
            watchdog.cancel()
        record.bytes_out = sent
        await send({"type": "http.response.body", "body": b""})
        return ttfb, None

