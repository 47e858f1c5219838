"""Connection-level limits: request-head and body deadlines, head sizes and connection caps.

They live below ASGI, in a subclass of uvicorn's httptools protocol that `prefix-router serve`
passes as `http=` (`HTTP_PROTOCOL`, imported by name in every `--workers` process), because
uvicorn 0.54 enforces only one of them itself (read from its `httptools_impl`/`h11_impl`):

* `limits.keepalive_timeout` is uvicorn's `timeout_keep_alive`: armed when a response completes,
  cancelled by the next byte. It is the only deadline uvicorn has.
* No deadline covers a request head or body: every received byte cancels the keep-alive timer,
  which is never armed on a fresh connection, so a connection that sends nothing, or one header
  line a second, is held forever (slowloris). The app never sees an incomplete head.
* httptools (llhttp) has no header count or size limit and uvicorn keeps every header; h11 (not
  used: the router pins httptools, a dependency through `uvicorn[standard]`) bounds the head with
  `h11_max_incomplete_event_size` (16 KiB) but answers 400, and counts nothing.
* `limit_concurrency` is checked when a head is complete (a slowloris connection never gets
  there), counts tasks as well as connections, and answers a plain-text 503.

Per connection, one timer slot and a phase; phases never overlap:

    HEAD    from accept (first request, as nginx's client_header_timeout) or from the first byte
            of a later request, until the head is complete: `header_timeout` -> 408
    BODY    head complete, body not: deadline = start + `body_timeout` + received/`body_min_rate`,
            recomputed when the timer fires and re-armed while bytes keep coming. A body sent at
            >= body_min_rate never expires; a trickle expires after ~body_timeout; no body holds
            a connection longer than body_timeout + max_body_bytes/body_min_rate (413 beyond).
            On expiry: 408 if no response has started (the app's receive() then sees a
            disconnect and leaves the log line to the guard: `refused_by`), else close.
    DONE    the app has the whole request; after the response uvicorn's keep-alive timer runs.
    CLOSING after a rejection: the answer (OpenAI error JSON, `Connection: close`) is written, the
            write side closed (FIN), input read and dropped so the client gets the answer instead
            of a reset, and the connection closed when the client closes or after `LINGER` s.

Sizes: a request target longer than `max_request_line` -> 414 as it arrives; more than
`max_header_count` headers -> 431; header bytes (sum of name + value + 4) over
`max_header_bytes` -> 431, computed only when the bytes received for the head exceed the limit,
and, while a head is incomplete, as soon as the bytes received after the read it began in exceed
max_request_line + max_header_bytes (so httptools never buffers more than that plus one read).

Caps: `ConnectionGuard.admit` runs in `connection_made`, before any byte is read: beyond
`max_connections` (or `max_connections_per_client` from one peer address, off by default) the
connection gets 503 with `Retry-After: 1` at once and the CLOSING treatment; it never waits.
Caps are per process (`--workers N` admits up to N x max_connections in total).

Every rejection counts `rejected_total{reason}` and writes one access-log line naming the
setting (`limit`), with method and path only when the head was complete - never a header value.

Client disconnect: every request's scope carries `DISCONNECT_HOOK` (None). The proxy puts its
disconnect callback there while it forwards (`router.proxy.Forwarder.forward`), and
`connection_lost` calls it when the connection is lost before the response completed; lost
before a callback was put there, the slot is set to `DISCONNECTED`. So the proxy learns of a
disconnect without awaiting the ASGI ``receive()`` beside the upstream exchange, which is how
it watches under any other server.

Cost: a request whose head and body arrive in one read arms no timer (the first request's head
timer is armed once per connection, at accept); per request a few attribute updates, one
`loop.time()` and a `len(headers)`. Timers only exist for heads and bodies that span reads.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from router.accesslog import AccessLog, AccessRecord
from router.errors import (
    HeaderFieldsTooLarge,
    RequestTimeout,
    RouterError,
    TooManyConnections,
    UriTooLong,
    raw_response,
)
from router.metrics import RouterMetrics
from router.settings import LimitsSettings, Settings

__all__ = ["DISCONNECTED", "DISCONNECT_HOOK", "HTTP_PROTOCOL", "LINGER", "ConnectionGuard",
           "LimitedHttpToolsProtocol", "Rejection", "body_deadline", "ensure_descriptors",
           "header_bytes", "refused_by"]

HTTP_PROTOCOL = "router.limits:LimitedHttpToolsProtocol"
LINGER = 1.0            # seconds a rejected connection is read (and dropped) before it closes
DESCRIPTOR_RESERVE = 256  # listeners, replica pool, probes, files: beyond the two caps
_SCOPE_KEY = "prefix_router.limit"
# scope key of the disconnect callback slot (module docstring); DISCONNECTED: lost before one
DISCONNECT_HOOK = "prefix_router.on_disconnect"
DISCONNECTED = "disconnected"
_HEAD, _BODY, _DONE, _CLOSING = range(4)


@dataclass(frozen=True, slots=True)
class Rejection:
    """One limit's answer: the dotted setting (access log `limit`), the `rejected_total`
    reason, the status and the whole raw response."""

    setting: str
    reason: str
    status: int
    response: bytes


def _rejection(setting: str, reason: str, err: RouterError) -> Rejection:
    return Rejection(f"limits.{setting}", reason, err.status, raw_response(err))


def body_deadline(start: float, received: int, limits: LimitsSettings) -> float:
    """When a body that began at `start` and has `received` bytes so far times out."""
    return start + limits.body_timeout + received / limits.body_min_rate


def header_bytes(headers: Iterable[tuple[bytes, bytes]]) -> int:
    return sum(len(name) + len(value) + 4 for name, value in headers)  # ": " and CRLF


def refused_by(scope: MutableMapping[str, Any]) -> str | None:
    """The setting whose deadline ended this request's body (the guard logged it), or None."""
    setting: str | None = scope.get(_SCOPE_KEY)
    return setting


class ConnectionGuard:
    """Per-process connection accounting and the rejections of one `limits` section.

    Invariant: `open` = admitted connections not yet lost = the `connections` gauge of this
    process; a peer address is in `_per_client` only while it has an admitted connection (and
    only when the per-client cap is on)."""

    def __init__(self, limits: LimitsSettings, metrics: RouterMetrics,
                 access_log: AccessLog | None) -> None:
        self.limits = limits
        self.open = 0
        self._per_client: dict[str, int] = {}
        self._metrics = metrics
        self._gauge = metrics.connections
        self._log = access_log
        lim = limits
        self.head_bound = lim.max_request_line + lim.max_header_bytes
        self.header_timeout = _rejection("header_timeout", "header_timeout", RequestTimeout(
            f"request head not received within {lim.header_timeout:g} s"))
        self.body_timeout = _rejection("body_timeout", "body_timeout", RequestTimeout(
            f"request body not received within {lim.body_timeout:g} s plus 1 s per "
            f"{lim.body_min_rate} bytes"))
        self.request_line = _rejection("max_request_line", "request_line_too_long", UriTooLong(
            f"request line longer than {lim.max_request_line} bytes"))
        self.header_count = _rejection(
            "max_header_count", "too_many_headers",
            HeaderFieldsTooLarge(f"more than {lim.max_header_count} request header fields"))
        self.header_size = _rejection(
            "max_header_bytes", "headers_too_large",
            HeaderFieldsTooLarge(f"request header fields larger than {lim.max_header_bytes} "
                                 "bytes"))
        self.connections = _rejection("max_connections", "too_many_connections",
                                      TooManyConnections(
                                          f"router at {lim.max_connections} open connections; "
                                          "retry shortly", retry_after=1))
        self.client_connections = _rejection(
            "max_connections_per_client", "too_many_client_connections",
            TooManyConnections(f"{lim.max_connections_per_client} open connections from this "
                               "address; retry shortly", retry_after=1))

    def admit(self, client: str | None) -> Rejection | None:
        """Count a new connection in, or the rejection that refuses it (nothing counted)."""
        if self.open >= self.limits.max_connections:
            return self.connections
        cap = self.limits.max_connections_per_client
        if cap and client is not None:
            n = self._per_client.get(client, 0)
            if n >= cap:
                return self.client_connections
            self._per_client[client] = n + 1
        self.open += 1
        self._gauge.inc()
        return None

    def release(self, client: str | None) -> None:
        self.open -= 1
        self._gauge.dec()
        if self.limits.max_connections_per_client and client is not None:
            n = self._per_client.pop(client, 1) - 1
            if n > 0:
                self._per_client[client] = n

    def rejected(self, r: Rejection, *, method: str = "-", path: str = "-",
                 seconds: float = 0.0, bytes_in: int = 0) -> None:
        self._metrics.reject(r.reason)
        if self._log is not None:
            self._log.emit(AccessRecord(method, path, r.status, duration_ms=round(
                seconds * 1000, 3), bytes_in=bytes_in, limit=r.setting))


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; httptools re-raises it as the context of
    an HttpParserCallbackError."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.setting)
        self.rejection = rejection


def _find_guard(app: Any) -> ConnectionGuard:
    for _ in range(8):  # uvicorn may wrap the app in its middlewares (each keeps `.app`)
        guard = getattr(app, "connection_guard", None)
        if isinstance(guard, ConnectionGuard):
            return guard
        app = getattr(app, "app", None)
    raise TypeError("LimitedHttpToolsProtocol needs an app with a `connection_guard` "
                    "(router.app.RouterApp)")


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the phases, sizes and caps of the module docstring."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.guard = _find_guard(self.app)
        self._phase = _DONE
        self._timer: asyncio.TimerHandle | None = None
        self._peer: str | None = None
        self._admitted = False
        self._fresh = True    # no request began on this connection yet
        self._t0 = 0.0        # start of the current head (HEAD) or body (BODY)
        self._chunk = 0       # length of the read being parsed
        self._seen = 0        # bytes of the reads that carried the current head (upper bound)
        self._first = 0       # ... of which the read it began in (seen - first: lower bound)
        self._received = 0    # body bytes of the current request

    # connection --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self._peer = peer[0] if isinstance(peer, tuple) else None
        refusal = self.guard.admit(self._peer)
        if refusal is not None:
            self.transport = transport
            self._reject(refusal)
            return
        self._admitted = True
        super().connection_made(transport)
        self._phase = _HEAD
        self._t0 = self.loop.time()
        self._timer = self.loop.call_at(self._t0 + self.guard.limits.header_timeout,
                                        self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._admitted:
            self._admitted = False
            self.guard.release(self._peer)
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:
            scope: Any = cycle.scope
            hook = scope.get(DISCONNECT_HOOK)
            if callable(hook):
                hook()
            elif DISCONNECT_HOOK in scope:
                scope[DISCONNECT_HOOK] = DISCONNECTED

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, plus the phase bookkeeping and the refusals of the callbacks
        if self._phase == _CLOSING:
            return
        self._unset_keepalive_if_required()
        self._chunk = len(data)
        if self._phase == _HEAD:
            self._seen += self._chunk
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._reject(refused.rejection)
            else:
                self._invalid()
            return
        except httptools.HttpParserError:
            self._invalid()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self._hand_off()
                self.handle_websocket_upgrade()
                return
            self._unsupported_upgrade_warning()
        phase = self._phase
        if phase == _HEAD:
            if self._seen - self._first > self.guard.head_bound:
                self._reject(self.guard.header_size)
            elif self._timer is None:
                self._timer = self.loop.call_at(self._t0 + self.guard.limits.header_timeout,
                                                self._head_expired)
        elif phase == _BODY and self._timer is None:
            self._timer = self.loop.call_at(
                body_deadline(self._t0, self._received, self.guard.limits), self._body_expired)

    def _invalid(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self._stop_timer()
        self._phase = _CLOSING
        self.send_400_response(msg)

    def _hand_off(self) -> None:
        """A WebSocket upgrade: the connection leaves this protocol (and the accounting)."""
        self._stop_timer()
        self._phase = _CLOSING
        if self._admitted:
            self._admitted = False
            self.guard.release(self._peer)

    # parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[DISCONNECT_HOOK] = None  # type: ignore[literal-required]
        if self._fresh:
            self._fresh = False   # the head deadline has run since accept
            self._first = 0
        else:
            self._t0 = self.loop.time()
            self._seen = self._first = self._chunk
        self._phase = _HEAD

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.guard.limits.max_request_line:
            raise _Refused(self.guard.request_line)

    def on_headers_complete(self) -> None:
        guard = self.guard
        if len(self.headers) > guard.limits.max_header_count:
            raise _Refused(guard.header_count)
        limit = guard.limits.max_header_bytes
        if self._seen > limit and header_bytes(self.headers) > limit:
            raise _Refused(guard.header_size)
        super().on_headers_complete()
        self._stop_timer()
        self._phase = _BODY
        self._t0 = self.loop.time()
        self._received = 0

    def on_body(self, body: bytes) -> None:
        self._received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _DONE
        self._stop_timer()

    # deadlines -----------------------------------------------------------------------------

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_expired(self) -> None:
        self._timer = None
        if self._phase == _HEAD:
            self._reject(self.guard.header_timeout)

    def _body_expired(self) -> None:
        self._timer = None
        if self._phase != _BODY:
            return
        now = self.loop.time()
        limits = self.guard.limits
        if self.flow.read_paused:
            # the router's own back-pressure (a pipelined request, a full buffer), not the
            # client's doing: a fresh body_timeout from now
            self._t0 = now - self._received / limits.body_min_rate
        deadline = body_deadline(self._t0, self._received, limits)
        if now < deadline:
            self._timer = self.loop.call_at(deadline, self._body_expired)
            return
        self._reject(self.guard.body_timeout)

    # rejection -----------------------------------------------------------------------------

    def _reject(self, r: Rejection) -> None:
        """Answer `r`, count and log it, and close as the module docstring's CLOSING says."""
        phase, self._phase = self._phase, _CLOSING
        self._stop_timer()
        self._unset_keepalive_if_required()
        transport = self.transport
        cycle = self.cycle
        method = path = "-"
        seconds = self.loop.time() - self._t0 if self._admitted else 0.0
        answer = True
        if phase == _BODY and cycle is not None:
            method, path = cycle.scope["method"], cycle.scope["path"]
            if cycle.response_started:
                answer = False   # the app already answered; its unread body is what expired
            else:
                cycle.scope[_SCOPE_KEY] = r.setting  # type: ignore[literal-required]
                cycle.disconnected = True   # the app's receive() returns http.disconnect
                cycle.message_event.set()
        elif cycle is not None and not cycle.response_complete:
            # a pipelined head behind a response still being written: end after that response
            cycle.keep_alive = False
            self.flow.pause_reading()
            self.guard.rejected(r, seconds=seconds)
            return
        self.guard.rejected(r, method=method, path=path, seconds=seconds,
                            bytes_in=self._received if phase == _BODY else 0)
        if transport.is_closing():
            return
        if answer:
            transport.write(r.response)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = self.loop.call_later(LINGER, transport.close)


def ensure_descriptors(settings: Settings) -> str | None:
    """Raise this process's soft RLIMIT_NOFILE to what the caps need (max_connections +
    max_in_flight + DESCRIPTOR_RESERVE), up to the hard limit; a warning when it cannot.
    Worker processes inherit the raised limit."""
    need = (settings.limits.max_connections + settings.proxy.max_in_flight
            + DESCRIPTOR_RESERVE)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        return (f"open-file limit {target} is below limits.max_connections + "
                f"proxy.max_in_flight + {DESCRIPTOR_RESERVE} = {need}: connections beyond it "
                "fail to be accepted instead of getting a 503 (raise `ulimit -n`)")
    return None
